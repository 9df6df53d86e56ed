"""The same Reverb calls through Reverb itself and through ``rlreplay.reverb``, and the
equivalent calls through rlreplay's own API (what the compatibility layer costs).

Measured, each against a server in its own process on 127.0.0.1:

* ``writer``: an Acme-style transition writer, ``trajectory_writer`` appending
  ``{obs, action, reward}`` per step and creating one item per step
  (``obs``/``next_obs`` from ``history['obs'][-2:]``), ``end_episode`` every 100 steps:
  steps/s.
* ``sampling``: ``TrajectoryDataset.from_table_signature(...).batch(256)`` streamed from
  a uniform table: items/s.
* ``learner``: the same dataset over a prioritized table, each batch followed by
  ``client.mutate_priorities`` of its 256 keys: batches/s.

rlreplay's own API for the same work (``--impl native``): ``Client.insert`` of the
items' rows, 64 per awaited call (the batches the layer's writer sends),
``Client.sample_iterator`` batches, and an awaited ``Client.update_priorities`` per batch
(as Reverb's ``mutate_priorities`` waits). The writer is measured once more as rlreplay's
actors run it: a ``RemoteTrajectoryWriter`` appending the same steps to a transition table
(each step stored once, an item a window over two steps) and creating one item per step,
``end_episode`` every 100 steps. The learner loop is measured once more as
rlreplay's learners run it, each batch's priorities sent with the iterator's next request
(``SampleIterator.update_priorities``: one round trip a cycle), and compared with
Reverb's learner loop.

Reverb runs in its own interpreter (Python 3.11 with ``dm-reverb==0.14.0``,
TensorFlow 2.15 and ``numpy<2``)::

    python benchmarks/bench_reverb_compat.py --reverb-python /tmp/reverbenv/bin/python

prints one JSON object per implementation and the ratios.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path

# Run as a script (by another interpreter, too): the repository root for benchmarks.children.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.children import reply_from

OBS = 8
TABLE_SIZE = 1 << 15
HELD = 64  # items rlreplay.reverb's writer holds before one insert (coming_from_reverb.md)
BATCH = 256
CPU: dict[str, float] = {}  # the client process's CPU time per unit, by measure


def _reverb(impl: str):
    if impl == "reverb":
        import reverb
    else:
        import rlreplay.reverb as reverb
    return reverb


def signature(reverb, np):
    spec = getattr(reverb, "TensorSpec", None)
    if spec is None:  # real Reverb: TensorFlow's
        import tensorflow as tf

        spec = tf.TensorSpec
    return {
        "obs": spec([OBS], np.float32),
        "next_obs": spec([OBS], np.float32),
        "action": spec([], np.int64),
        "reward": spec([], np.float32),
    }


def serve(impl: str, out, stop) -> None:
    import numpy as np

    reverb = _reverb("rlreplay" if impl == "native" else impl)
    sig = signature(reverb, np)
    tables = [
        reverb.Table(
            "uniform",
            sampler=reverb.selectors.Uniform(),
            remover=reverb.selectors.Fifo(),
            max_size=TABLE_SIZE,
            rate_limiter=reverb.rate_limiters.MinSize(1),
            signature=sig,
        ),
        reverb.Table(
            "prio",
            sampler=reverb.selectors.Prioritized(0.6),
            remover=reverb.selectors.Fifo(),
            max_size=TABLE_SIZE,
            rate_limiter=reverb.rate_limiters.MinSize(1),
            signature=sig,
        ),
    ]
    server = reverb.Server(tables=tables)
    own = None
    if impl == "native":  # rlreplay's own server beside it, for its streaming writer
        import rlreplay

        step = {"obs": ((OBS,), "float32"), "action": "int64", "reward": "float32"}
        layout = rlreplay.ItemLayout.transition(step)
        table = rlreplay.Table("transitions", signature=step, layout=layout, max_size=TABLE_SIZE)
        own = rlreplay.Server([table], bind="127.0.0.1").start()
    out.put((server.port, None if own is None else own.address))
    stop.wait(900)
    server.stop()
    if own is not None:
        own.stop()


def write(reverb, client, table: str, steps: int, np) -> float:
    """The transition writer; returns steps/s."""
    rng = np.random.default_rng(0)
    obs = rng.random((1024, OBS), dtype=np.float32)
    start, cpu = time.perf_counter(), time.process_time()
    with client.trajectory_writer(num_keep_alive_refs=2) as writer:
        for t in range(steps):
            writer.append({"obs": obs[t % 1024], "action": np.int64(t), "reward": np.float32(1)})
            if writer.episode_steps >= 2:
                h = writer.history
                writer.create_item(
                    table,
                    1.0,
                    {
                        "obs": h["obs"][-2],
                        "next_obs": h["obs"][-1],
                        "action": h["action"][-2],
                        "reward": h["reward"][-2],
                    },
                )
            if (t + 1) % 100 == 0:
                writer.end_episode()
        writer.flush()
    CPU["writer_client_cpu_us_per_step"] = (time.process_time() - cpu) / steps * 1e6
    return steps / (time.perf_counter() - start)


def native_write(client, table: str, steps: int, np) -> float:
    """The same items through rlreplay's own ``Client.insert``: the row each item is,
    ``HELD`` rows per awaited call, as the layer's writer sends the items it holds."""
    rng = np.random.default_rng(0)
    obs = rng.random((1024, OBS), dtype=np.float32)
    start, cpu = time.perf_counter(), time.process_time()
    held: list[dict] = []
    for t in range(steps):
        if t % 100:
            held.append(
                {
                    "c0": np.int64(t - 1),
                    "c1": obs[t % 1024],
                    "c2": obs[(t - 1) % 1024],
                    "c3": np.float32(1),
                    "steps": 0,
                }
            )
        if len(held) == HELD or (held and t == steps - 1):
            rows = {name: np.stack([row[name] for row in held]) for name in held[0]}
            client.insert(table, rows, 1.0)
            held.clear()
    CPU["writer_client_cpu_us_per_step"] = (time.process_time() - cpu) / steps * 1e6
    return steps / (time.perf_counter() - start)


def stream_write(client, steps: int, np) -> float:
    """The transitions through rlreplay's ``RemoteTrajectoryWriter``; returns steps/s."""
    rng = np.random.default_rng(0)
    obs = rng.random((1024, OBS), dtype=np.float32)
    start, cpu = time.perf_counter(), time.process_time()
    with client.trajectory_writer("transitions", max_in_flight=4) as writer:
        for t in range(steps):
            writer.append({"obs": obs[t % 1024], "action": np.int64(t), "reward": np.float32(1)})
            if writer.episode_steps >= 2:
                writer.create_item("transitions", 1.0)
            if (t + 1) % 100 == 0:
                writer.end_episode()
        writer.flush()
    CPU["stream_writer_client_cpu_us_per_step"] = (time.process_time() - cpu) / steps * 1e6
    return steps / (time.perf_counter() - start)


def measure(impl: str, ports: tuple, duration: float) -> dict:
    import numpy as np

    address = f"localhost:{ports[0]}"
    result: dict = {"impl": impl}
    if impl == "native":
        from rlreplay.net.client.client import Client

        client = Client(address)
        result["writer_steps_per_s"] = native_write(client, "uniform", 3000, np)
        with Client(ports[1]) as own:
            stream_write(own, 3000, np)  # warm-up
            result["stream_writer_steps_per_s"] = stream_write(own, 30000, np)
        result.update(CPU)
        native_write(client, "prio", TABLE_SIZE, np)
        for key, table, learn in (
            ("sampling", "uniform", None),
            ("learner", "prio", "awaited"),
            ("learner_next_request", "prio", "next request"),
        ):
            n, rng = 0, np.random.default_rng(1)
            with client.sample_iterator(table, BATCH, in_flight=2) as it:
                end = time.perf_counter() + duration
                start, cpu = time.perf_counter(), time.process_time()
                for batch in it:
                    priorities = rng.random(BATCH) + 0.01
                    if learn == "awaited":  # as Reverb's mutate_priorities
                        client.update_priorities(table, batch.info.keys, priorities)
                    elif learn == "next request":  # as an rlreplay learner sends them
                        it.update_priorities(batch.info.keys, priorities)
                    n += 1
                    if time.perf_counter() > end:
                        break
                elapsed = time.perf_counter() - start
                cpu = (time.process_time() - cpu) / n * 1e6
            result[f"{key}_client_cpu_us_per_batch"] = cpu
            rate = "items" if learn is None else "batches"
            result[f"{key}_{rate}_per_s"] = n * (BATCH if learn is None else 1) / elapsed
        return result

    reverb = _reverb(impl)
    client = reverb.Client(address)
    write(reverb, client, "uniform", 300, np)  # warm-up
    steps = 3000
    result["writer_steps_per_s"] = write(reverb, client, "uniform", steps, np)
    result.update(CPU)
    write(reverb, client, "prio", TABLE_SIZE, np)
    for name, table in (("sampling", "uniform"), ("learner", "prio")):
        ds = reverb.TrajectoryDataset.from_table_signature(
            address, table, max_in_flight_samples_per_worker=2 * BATCH
        ).batch(BATCH)
        n, rng = 0, np.random.default_rng(1)
        it = ds.as_numpy_iterator()
        next(it)
        end = time.perf_counter() + duration
        start, cpu = time.perf_counter(), time.process_time()
        for sample in it:
            if name == "learner":
                keys = sample.info.key.tolist()
                client.mutate_priorities(
                    table, updates=dict(zip(keys, (rng.random(len(keys)) + 0.01).tolist()))
                )
            n += 1
            if time.perf_counter() > end:
                break
        elapsed = time.perf_counter() - start
        result[f"{name}_client_cpu_us_per_batch"] = (time.process_time() - cpu) / n * 1e6
        if name == "sampling":
            result["sampling_items_per_s"] = n * BATCH / elapsed
        else:
            result["learner_batches_per_s"] = n / elapsed
    return result


def run(impl: str, duration: float) -> dict:
    ctx = mp.get_context("spawn")
    out, stop = ctx.Queue(), ctx.Event()
    proc = ctx.Process(
        target=serve, args=(impl, out, stop), daemon=True
    )
    proc.start()
    try:
        ports = reply_from(proc, out, 300)
        return measure(impl, ports, duration)
    finally:
        stop.set()
        proc.join(30)
        if proc.is_alive():
            proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=2.0, help="seconds per stream measure")
    parser.add_argument("--impl", choices=["reverb", "rlreplay", "native"], help="one only")
    parser.add_argument(
        "--reverb-python",
        default=os.environ.get("RLREPLAY_REVERB_PYTHON", "/tmp/reverbenv/bin/python"),
    )
    args = parser.parse_args()
    if args.impl:
        print(json.dumps(run(args.impl, args.duration)), flush=True)
        return
    results = {}
    if Path(args.reverb_python).exists():
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH="")
        done = subprocess.run(
            [args.reverb_python, __file__, "--impl", "reverb", "--duration", str(args.duration)],
            capture_output=True,
            text=True,
            env=env,
            timeout=900,
        )
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
        results["reverb"] = json.loads(lines[-1]) if lines else {"error": done.stderr[-2000:]}
    for impl in ("rlreplay", "native"):
        results[impl] = run(impl, args.duration)
    for res in results.values():
        print(json.dumps(res))
    ours, native, theirs = results["rlreplay"], results["native"], results.get("reverb", {})
    for key in ("writer_steps_per_s", "sampling_items_per_s", "learner_batches_per_s"):
        line = f"{key}: rlreplay.reverb {ours[key]:,.0f}, rlreplay's own API {native[key]:,.0f}"
        line += f" (layer costs {1 - ours[key] / native[key]:.0%})"
        if key in theirs:
            line += f", Reverb {theirs[key]:,.0f} -> {ours[key] / theirs[key]:.1f}x Reverb"
        print(line)
    if "writer_steps_per_s" in theirs:
        own = native["stream_writer_steps_per_s"]
        print(
            f"writer as rlreplay's actors run it (RemoteTrajectoryWriter, transition items over "
            f"stored steps): {own:,.0f} steps/s -> {own / theirs['writer_steps_per_s']:.1f}x "
            "Reverb's trajectory_writer"
        )
    if "learner_batches_per_s" in theirs:
        own = native["learner_next_request_batches_per_s"]
        print(
            f"learner loop as rlreplay's learners run it (priorities with the next sample "
            f"request): {own:,.0f} batches/s -> {own / theirs['learner_batches_per_s']:.1f}x "
            "Reverb's learner loop (dataset batch, then mutate_priorities)"
        )
    for key in (
        "writer_client_cpu_us_per_step",
        "sampling_client_cpu_us_per_batch",
        "learner_client_cpu_us_per_batch",
    ):
        line = f"{key}: rlreplay.reverb {ours[key]:.1f}, rlreplay's own API {native[key]:.1f}"
        if key in theirs:
            line += f", Reverb {theirs[key]:.1f}"
        print(line)


if __name__ == "__main__":
    main()
