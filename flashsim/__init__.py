"""flashsim: flash attention step by step under explicit precision policies (planned; see issue 4)."""
