#!/bin/bash
# FlashAttention-4 on the device machine, which cannot download: its wheels travel in two calls (the CUDA 13 DSL
# libraries' wheel is larger than one call carries).  Call 1 carries .fa4a (the first part of the libraries'
# contents, tar.xz) and runs `bash studies/device/fa4_install.sh stash`; call 2, on the still-warm machine,
# carries .fa4b (the rest and the other wheels) and runs `source studies/device/fa4_install.sh install`, which
# installs into /tmp/site and puts it on PYTHONPATH.  Made here by
#   pip download --no-deps --only-binary=:all: --python-version 3.12 ... flash-attn-4==4.0.0b40
#     nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 nvidia-cutlass-dsl-libs-core==4.8.1
#     nvidia-cutlass-dsl-libs-cu13==4.8.1 apache-tvm-ffi torch-c-dlpack-ext quack-kernels
# the libs-cu13 wheel unpacked, tarred, `xz -9` and split at 40,000,000 bytes (sha256 of the whole in FA4_SHA).
FA4_SHA=6cf1731ff3026b320ca2df43f26b57a5deddfaaa825ac2d9d09f5b736f12eedc
case "$1" in
stash)
    mkdir -p /root/fa4parts && cp .fa4a/cu13.part.* /root/fa4parts/ && ls -la /root/fa4parts ;;
install)
    cat /root/fa4parts/cu13.part.aa .fa4b/cu13.part.ab > /tmp/cu13.tar.xz || return 1
    echo "$FA4_SHA  /tmp/cu13.tar.xz" | sha256sum -c || return 1
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .fa4b/*.whl || return 1
    tar xJf /tmp/cu13.tar.xz -C /tmp/site || return 1
    export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH  # what its .pth file adds
    python3 -c "import flash_attn.cute.interface as i; print('flash_attn.cute ready')" ;;
*)
    echo "usage: bash studies/device/fa4_install.sh stash | source studies/device/fa4_install.sh install" >&2 ;;
esac
