"""Running a sweep on dask.distributed: plan what is left, compute it on a cluster, store each result as it lands.

A LocalCluster of processes by default (one per core, one thread each, ``NUMBA_NUM_THREADS=1`` so that the
workers do not contend for the cores), or an existing cluster by its scheduler's address.  The client (this
process) plans the tasks from what the output folder already holds, writes every finished task and cell
([`flashsim.sweep.store`][flashsim.sweep.store]), and shows cells done, rows per second and the time left.  The workers
only
compute ([`flashsim.sweep.work.compute_task()`][flashsim.sweep.work.compute_task]): they need the same Python packages,
not the folder.  An
engine other than the emulator ([`flashsim.sweep.engines`][flashsim.sweep.engines]) travels with each task; where every
worker is on
one machine, a Dask semaphore keeps its users to the engine's ``local_slots``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import shutil
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..console import folder_lock, physical_memory
from .engines import DEFAULT_CONFIRM, EMULATOR, ConfirmationError, EngineError, RowEngine, usable_engine
from .spec import Cell, Group, SpecError, SweepSpec, describe, estimate
from .store import Store, open_store
from .work import Task, compute_task

#: a sweep estimated to take longer than this (seconds) says how long before it starts
LONG_SECONDS = 60.0


class MismatchError(SpecError):
    """An engine's O differed from the emulator's on a confirmed row (the message names the cell and rows)."""


class TaskError(SpecError):
    """A task failed on a worker: the cell's settings cannot be computed (the message names the group)."""


@dataclass(frozen=True)
class Plan:
    """What a run has to do: the tasks to compute, and groups whose chunks are all there but not their cells;
    ``routing``: for each cell, None when the engine computes it, else why the emulator does."""

    tasks: tuple[Task, ...]
    ready: tuple[Group, ...]
    n_cells: int
    done_before: int
    routing: dict[str, str | None] = field(default_factory=dict)


@dataclass(frozen=True)
class SweepResult:
    """What one run did.  ``cell_rows``: rows computed, counted once per cell (a row under one policy, tile and
    softmax variant); ``seconds``: from the first task submitted to the last result stored."""

    n_cells: int
    done_before: int
    written: int
    tasks: int
    cell_rows: int
    seconds: float
    startup_seconds: float
    dashboard: str

    @property
    def rows_per_second(self) -> float:
        return self.cell_rows / self.seconds if self.seconds > 0 else float("nan")


def route(cells: list[Cell], engine: RowEngine) -> dict[str, str | None]:
    """For each cell (by id): None when ``engine`` computes it, else why the emulator does."""
    if engine.name == EMULATOR.name:
        return {c.id: None for c in cells}
    return {c.id: engine.why_not(c) for c in cells}


def plan(spec: SweepSpec, store: Store, engine: RowEngine = EMULATOR, confirm: int = DEFAULT_CONFIRM) -> Plan:
    """The tasks still to compute: for each group with a cell not yet written, its chunks not yet written; each
    task computes on ``engine`` the cells it reproduces (``confirm`` rows of each checked on the emulator)."""
    done = store.done_cells()
    tasks: list[Task] = []
    ready: list[Group] = []
    routing: dict[str, str | None] = {}
    for group in spec.groups():
        cells = spec.cells(group)
        if all(c.id in done for c in cells):
            shutil.rmtree(store.chunk_dir(group), ignore_errors=True)  # a run killed after its last cell
            continue
        have = store.done_chunks(group)
        missing = [(first, n) for first, n in spec.chunks() if first not in have]
        if missing:
            routes = route(cells, engine)
            routing.update(routes)
            on = frozenset(cid for cid, why in routes.items() if why is None) if engine is not EMULATOR else frozenset()
            tasks.extend(Task(group, first, n, tuple(cells), engine, on, confirm) for first, n in missing)
        else:
            ready.append(group)
    n_cells = len(spec.cells())
    return Plan(tuple(tasks), tuple(ready), n_cells, len(done & {c.id for c in spec.cells()}), routing)


def describe_routing(engine: RowEngine, routing: dict[str, str | None], confirm: int) -> list[str]:
    """Lines saying how many cells left to compute the engine takes, and why the emulator takes the others."""
    if engine.name == EMULATOR.name or not routing:
        return []
    on = sum(why is None for why in routing.values())
    lines = [
        f"engine {engine.name}: {on} of {len(routing)} cells to compute ({confirm} rows a task of each confirmed "
        f"bit for bit on the emulator); the emulator computes the other {len(routing) - on}"
    ]
    reasons: dict[str, int] = {}
    for why in routing.values():
        if why is not None:
            reasons[why] = reasons.get(why, 0) + 1
    lines += [f"  on the emulator, {n} cell{'s' * (n > 1)}: {why}" for why, n in sorted(reasons.items())]
    return lines


def _describe_group(group: Group) -> str:
    return (
        f"family {group.family.label}, seed {group.seed}, n_keys {group.n_keys}, head_dim {group.head_dim}, "
        f"format {group.fmt}"
    )


def one_host(client) -> bool:
    """Whether every worker of the client's cluster runs on one machine (then they share its devices)."""
    from urllib.parse import urlparse

    workers = client.scheduler_info().get("workers", {})
    return len({urlparse(addr).hostname for addr in workers}) <= 1


def _lease(client, engine: RowEngine):
    """A Dask semaphore limiting the tasks that use the engine at once to ``engine.local_slots``, where every
    worker runs on one machine (on a cluster of several machines each has its own device); or None."""
    if engine.local_slots is None or not one_host(client):
        return None
    from distributed import Semaphore

    return Semaphore(max_leases=engine.local_slots, name=f"flashsim-sweep-{engine.name}-{uuid.uuid4().hex[:8]}")


def _start_client(scheduler: str | None, workers: int | None):
    """(client, cluster or None, dashboard link or a note)."""
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise SpecError("sweep: needs dask.distributed: pip install 'lowprec-attention[sweep]'") from None
    if scheduler is not None:
        try:
            client = Client(scheduler, timeout="10s")
        except (OSError, TimeoutError, ValueError) as exc:
            raise SpecError(f"--scheduler: cannot connect to {scheduler} ({type(exc).__name__}: {exc})") from None
        return client, None, client.dashboard_link or "(the cluster has no dashboard)"
    has_bokeh = importlib.util.find_spec("bokeh") is not None
    cluster = LocalCluster(
        n_workers=workers or os.cpu_count() or 1,
        threads_per_worker=1,
        processes=True,
        silence_logs=logging.ERROR,
        dashboard_address=":8787" if has_bokeh else None,
        env={"NUMBA_NUM_THREADS": "1"},
        preload=["flashsim.sweep.quiet_worker"],
    )
    client = Client(cluster)
    link = (
        client.dashboard_link if has_bokeh else "(no dashboard: it needs bokeh; pip install 'lowprec-attention[sweep]')"
    )
    return client, cluster, link


def _bar(total: int, quiet: bool):
    from tqdm import tqdm

    return tqdm(
        total=total,
        unit="row",
        unit_scale=True,
        disable=quiet,
        file=sys.stderr,
        dynamic_ncols=True,
        bar_format="{desc} {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} cell-rows [{elapsed}<{remaining}, {rate_fmt}]",
    )


def run_sweep(
    spec: SweepSpec,
    out: str | Path,
    *,
    scheduler: str | None = None,
    workers: int | None = None,
    quiet: bool = False,
    spec_text: str | None = None,
    say: Callable[[str], None] | None = None,
    engine: str | RowEngine = EMULATOR,
    confirm: int = DEFAULT_CONFIRM,
    client=None,
) -> SweepResult:
    """Compute every cell of ``spec`` not yet in ``out``; finished cells and tasks are kept when interrupted.

    ``scheduler``: an existing cluster's address (default: a LocalCluster of ``workers`` processes, one per
    core); ``say``: where the one-line messages go (default: stderr, nothing when ``quiet``); ``engine``: what
    computes O of the cells it reproduces bit for bit (a name of [`engine_names()`][flashsim.sweep.engines.engine_names]
    or an engine; the emulator computes the other cells), ``confirm`` rows of each engine cell a task computed
    again on the emulator and compared bit for bit (a difference raises `MismatchError`); ``client``: a
    ``distributed.Client`` to run on instead (the caller starts and closes it; no ``scheduler`` or ``workers``).
    """
    if client is not None and (scheduler is not None or workers is not None):
        raise SpecError("client: give a client, or scheduler/workers for one to be started, not both")
    if isinstance(confirm, bool) or not isinstance(confirm, int) or confirm < 0:
        raise SpecError(f"--confirm: expected an integer >= 0, got {confirm!r}")
    eng = usable_engine(engine)
    if workers is not None and scheduler is not None:
        raise SpecError("--workers: only for the local cluster; with --scheduler the cluster's workers are used")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise SpecError(f"--workers: expected an integer >= 1, got {workers!r}")
    say = say or ((lambda _m: None) if quiet else (lambda m: print(m, file=sys.stderr, flush=True)))
    est = estimate(spec, workers or (os.cpu_count() or 1) if scheduler is None and client is None else 1)
    memory = physical_memory()
    if memory is not None and est.plan_bytes > memory // 2:
        raise SpecError(
            f"rows: {spec.rows} rows a cell in chunks of {spec.chunk_rows} make {est}, more than half this "
            f"machine's memory; lower rows or raise chunk_rows"
        )
    if est.seconds > LONG_SECONDS:
        say(f"flashsim sweep {spec.name}: {est}")
    Path(out).mkdir(parents=True, exist_ok=True)
    with folder_lock(out, "--out", f"flashsim sweep {spec.name}"):  # one run at a time writes a sweep's folder
        return _run(spec, open_store(out, spec, spec_text), eng, confirm, say, quiet, scheduler, workers, client)


def _run(
    spec: SweepSpec,
    store: Store,
    eng: RowEngine,
    confirm: int,
    say: Callable[[str], None],
    quiet: bool,
    scheduler: str | None,
    workers: int | None,
    client,
) -> SweepResult:
    """`run_sweep()`'s work, in its locked output folder."""
    todo = plan(spec, store, eng, confirm)
    say(f"flashsim sweep {spec.name}: {describe(spec)}; {todo.done_before} finished before, in {store.root}")
    for line in describe_routing(eng, todo.routing, confirm):
        say(f"flashsim sweep {spec.name}: {line}")
    written = 0
    for group in todo.ready:
        written += len(store.finish_group(group, spec.cells(group)))
    if not todo.tasks:
        say(f"flashsim sweep {spec.name}: all {todo.n_cells} cells finished")
        return SweepResult(todo.n_cells, todo.done_before, written, 0, 0, 0.0, 0.0, "")

    t0 = time.perf_counter()
    own = client is None
    if own:
        client, cluster, dashboard = _start_client(scheduler, workers)
    else:
        cluster, dashboard = None, client.dashboard_link or "(the cluster has no dashboard)"
    lease = _lease(client, eng) if any(t.engine_cells for t in todo.tasks) else None
    startup = time.perf_counter() - t0
    n_workers = len(client.scheduler_info().get("workers", {}))
    say(f"flashsim sweep {spec.name}: {len(todo.tasks)} tasks on {n_workers} workers; dashboard {dashboard}")
    groups = {g.id: i for i, g in enumerate(spec.groups())}
    pending: dict[str, set[int]] = {}
    for t in todo.tasks:
        pending.setdefault(t.group.id, set()).add(t.first_row)
    run_id = uuid.uuid4().hex[:8]
    futures = {}
    cell_rows = 0
    done = todo.done_before + written
    bar = _bar(sum(t.n_rows * len(t.cells) for t in todo.tasks), quiet)
    bar.set_description(f"cells {done}/{todo.n_cells}")
    t1 = time.perf_counter()
    try:
        from distributed import as_completed

        for t in todo.tasks:
            fut = client.submit(
                compute_task,
                t,
                lease,
                key=f"{t.key}-{run_id}",
                priority=len(groups) - groups[t.group.id],
                pure=False,
            )
            futures[fut] = t
        for fut in as_completed(list(futures)):
            task = futures[fut]
            try:
                results = fut.result()
            except ConfirmationError as exc:
                msg, _, where = str(exc).partition("; the cell: ")
                raise MismatchError(
                    f"{msg}; finished cells are kept (--engine {EMULATOR.name} goes on, on the emulator); the cell: "
                    f"{where}"
                ) from exc
            except EngineError:
                raise
            except Exception as exc:  # noqa: BLE001 - a worker's failure, reported with the group it was on
                raise TaskError(
                    f"sweep: a task failed ({_describe_group(task.group)}, rows {task.first_row}.."
                    f"{task.first_row + task.n_rows - 1}): {type(exc).__name__}: {exc}; finished cells are kept"
                ) from exc
            store.write_chunk(task.group, task.first_row, results)
            cell_rows += task.n_rows * len(task.cells)
            bar.update(task.n_rows * len(task.cells))
            left = pending[task.group.id]
            left.discard(task.first_row)
            if not left:
                n = len(store.finish_group(task.group, list(task.cells)))
                written += n
                done += n
                bar.set_description(f"cells {done}/{todo.n_cells}")
    except KeyboardInterrupt:
        bar.close()
        say(
            f"flashsim sweep {spec.name}: interrupted; {done} of {todo.n_cells} cells finished and kept in "
            f"{store.root} (run the same command again to go on)"
        )
        raise
    finally:
        bar.close()
        client.cancel(list(futures))
        if own:
            client.close()
        if cluster is not None:
            cluster.close()
    seconds = time.perf_counter() - t1
    with contextlib.suppress(OSError):  # the chunks folder, once no group has chunks left in it
        (store.root / "chunks").rmdir()
    result = SweepResult(
        todo.n_cells, todo.done_before, written, len(todo.tasks), cell_rows, seconds, startup, dashboard
    )
    say(
        f"flashsim sweep {spec.name}: {done} of {todo.n_cells} cells finished ({written} now), "
        f"{cell_rows} cell-rows in {seconds:.1f} s = {result.rows_per_second:.1f} cell-rows/s "
        f"(cluster start {startup:.1f} s)"
    )
    return result


__all__ = [
    "MismatchError",
    "Plan",
    "SweepResult",
    "TaskError",
    "describe_routing",
    "one_host",
    "plan",
    "route",
    "run_sweep",
]
