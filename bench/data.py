"""Prepared token datasets: how fast `dlc prepare` runs, what training from one costs in memory, BPE against bytes.

    python bench/data.py [--only throughput|memory|quality] [--quick] [--repeats 3] [--scale-gb 2]
                         [--small-mb 100] [--wall-s 150] [--seeds 0,1] [--keep DIR]

Three measurements, all by default or one with --only, each a Markdown table recorded, with the
command, commit, machine and date, in bench/RESULTS.md:
  throughput  `dlc prepare stdlib` with --tokenizer bytes and bpe:4096, on one worker and on every
              core this process may use, each --repeats times (the table gives the median). Prepare
              writes tokenizer.json between training a BPE and tokenizing, so the time to its
              appearance in --out is the start-up (and the BPE's training) and the rest is tokenizing.
  memory      two JSONL corpora made from the standard library (`make_corpus`), of ~--scale-gb GB and
              ~--small-mb MB on disk, each prepared with --tokenizer bytes on every core and trained
              from (recipes/tiny.yaml, 2 learners, 300 steps), while the resident memory of the driver
              (the `dlc train` process itself), of each learner (pids from events.jsonl) and of the
              evaluator is sampled every 0.5 s (psutil: RSS, USS, PSS, anonymous; and a learner's
              resident pages of the dataset's shards, from /proc/PID/smaps). For reference, each corpus is also
              trained from the old way, read whole into the driver (data.source=text), when the machine
              has 4 times its size free (the 2 GB one takes ~4 GiB in the driver, 2 GB of object store).
  quality     stdlib prepared twice with the same seed and eval fraction (so the same held-out
              documents), bytes and bpe:4096, and recipes/tiny.yaml trained on each for the same wall
              time (--wall-s) from each --seeds. The cosine schedule of each tokenizer is sized from a
              probe run of it (after a warm-up run that fills the compilation cache): its learners'
              steady steps/s times the wall time left after its start-up. Final eval bits per byte
              compare across tokenizers (eval loss is per token).
--quick: one repeat, corpora of 0.2 GB and 20 MB, 60 s of training from seed 0 alone.
Everything is written under a temporary directory (--keep DIR keeps it there), nothing in the
repository but RESULTS.md; every command runs in a process group of its own, stopped with the bench.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import psutil
import runner
import yaml
from proc_memory import MemorySampler, read_events
from runner import say

from dlc.data.corpus import stdlib_files
from dlc.data.manifest import TOKENIZER_FILE, Manifest, read_manifest

RECIPE = "recipes/tiny.yaml"
TOKENIZERS = ("bytes", "bpe:4096")
MB, GB = 10**6, 10**9  # decimal: text sizes, not memory
MIB = 2**20
PROBE_STEPS = 200
TEXT_MEMORY_FACTOR = 4  # free memory a data.source=text run needs, in corpus sizes (2x driver, 1x object store, slack)


def cores() -> int:
    """The CPUs this process may use (what `dlc prepare` takes by default)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def slug(tokenizer: str) -> str:
    """A tokenizer spec as part of a file name: bpe:4096 -> bpe4096."""
    return tokenizer.replace(":", "")


def prepare_command(sources: list[str], out: Path, tokenizer: str, *options: str) -> list[str]:
    """`dlc prepare SOURCES --out OUT --tokenizer TOKENIZER OPTIONS...`, from this checkout's code."""
    return [sys.executable, "-m", "dlc.cli", "prepare", *sources, "--out", str(out), "--tokenizer", tokenizer, *options]


def prepare(sources: list[str], out: Path, tokenizer: str, *options: str) -> dict[str, Any]:
    """Run `dlc prepare` into `out` (a new directory); its seconds in total and before tokenizing, and its manifest."""
    log = out.parent / f"{out.name}.prepare.log"
    shutil.rmtree(out, ignore_errors=True)  # an earlier invocation's, under --keep
    started = time.time()
    done = runner.run(prepare_command(sources, out, tokenizer, *options), log).check()
    manifest = read_manifest(out)
    before_s = (out / TOKENIZER_FILE).stat().st_mtime - started
    return {"wall_s": done.wall_s, "before_s": before_s, "tokenize_s": done.wall_s - before_s, "manifest": manifest}


def train(run_dir: Path, *overrides: str, **how: Any) -> runner.Finished:
    """`dlc train recipes/tiny.yaml` into a new `run_dir` (an earlier invocation's, under --keep, would resume)."""
    shutil.rmtree(run_dir, ignore_errors=True)
    return runner.train(RECIPE, run_dir, *overrides, **how).check()


def text_bytes(manifest: Manifest) -> int:
    return manifest.train.text_bytes + manifest.eval.text_bytes


def tokens(manifest: Manifest) -> int:
    return manifest.train.tokens + manifest.eval.tokens


def run_summary(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "summary.json").read_text())


def fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


# ---------------------------------------------------------------------------------------------
# 1. Prepare throughput


def throughput(args: argparse.Namespace, work: Path) -> None:
    n = cores()
    rows = []
    for tokenizer in TOKENIZERS:
        for workers in sorted({1, n}):
            runs = []
            for repeat in range(args.repeats):
                out = work / f"{slug(tokenizer)}-w{workers}-{repeat}"
                runs.append(prepare(["stdlib"], out, tokenizer, "--workers", str(workers)))
                say(f"prepare stdlib {tokenizer} --workers {workers}: {runs[-1]['wall_s']:.1f} s")
            manifest = runs[0]["manifest"]
            rows.append(
                {
                    "tokenizer": tokenizer,
                    "workers": workers,
                    "text_bytes": text_bytes(manifest),
                    "tokens": tokens(manifest),
                    **{key: statistics.median(r[key] for r in runs) for key in ("wall_s", "before_s", "tokenize_s")},
                    "walls": [r["wall_s"] for r in runs],
                }
            )
    lines = [
        f"`dlc prepare stdlib --tokenizer T --workers W` (the standard library's .py files, {len(stdlib_files())} "
        f"documents), each {args.repeats} time(s), the median; MB = 10^6 bytes of UTF-8 text. *Before tokenizing* "
        "runs from the command's start to tokenizer.json appearing in --out: the interpreter's start-up and the "
        "sources' listing, and for bpe:4096 the BPE's training on the training split (the whole corpus: it is under "
        "the 64 MiB sample). *Tokenizing* is the rest: reading, tokenizing, writing and hashing the shards.",
        "",
        "| tokenizer | workers | text (MB) | tokens | wall (s), each | before tokenizing (s) | tokenizing (s) | "
        "MB/s tokenizing | MB/s over the wall | tokens/s tokenizing |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['tokenizer']} | {r['workers']} | {r['text_bytes'] / MB:.1f} | {r['tokens']:,} | "
            f"**{r['wall_s']:.2f}** ({', '.join(f'{w:.2f}' for w in r['walls'])}) | {r['before_s']:.2f} | "
            f"{r['tokenize_s']:.2f} | **{r['text_bytes'] / MB / r['tokenize_s']:.1f}** | "
            f"{r['text_bytes'] / MB / r['wall_s']:.1f} | {r['tokens'] / r['tokenize_s']:,.0f} |"
        )
    bpe = {r["workers"]: r for r in rows if r["tokenizer"] != "bytes"}
    byte = {r["workers"]: r for r in rows if r["tokenizer"] == "bytes"}
    if 1 in bpe and 1 in byte:
        lines += [
            "",
            f"BPE training, read as bpe's time before tokenizing less bytes' (one worker): "
            f"{bpe[1]['before_s'] - byte[1]['before_s']:.1f} s; bpe:4096 gives "
            f"{bpe[1]['text_bytes'] / bpe[1]['tokens']:.2f} bytes per token (end-of-document tokens included). "
            f"{n} core(s) here.",
        ]
    options = ["--only", "throughput", "--repeats", str(args.repeats)]
    record("Prepared data: dlc prepare throughput", options, lines, args)


# ---------------------------------------------------------------------------------------------
# 2. Memory at scale


def make_corpus(directory: Path, target_bytes: int, file_bytes: int = 256 * MB) -> dict[str, Any]:
    """JSONL files of about `target_bytes` in `directory`: copies of the standard library's .py files.

    Copy k of file F is the line {"text": "# copy k of F\\n" + F's text}, so no two documents are the
    same; the copies follow each other, files of ~`file_bytes`. Reused when `directory` already holds
    the corpus of that size (corpus.json, written last).
    """
    done = directory / "corpus.json"
    if done.is_file() and json.loads(done.read_text())["target_bytes"] == target_bytes:
        return json.loads(done.read_text())
    started = time.monotonic()
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.jsonl"):
        stale.unlink()
    root = Path(sysconfig.get_paths()["stdlib"])
    files = stdlib_files()
    bodies = [json.dumps(f.read_bytes().decode("utf-8", errors="replace"))[1:-1].encode() for f in files]
    names = [f.relative_to(root).as_posix() for f in files]
    written, copies, out, size = 0, 0, None, 0
    try:
        while written < target_bytes:
            for name, body in zip(names, bodies, strict=True):
                if out is None or size >= file_bytes:
                    if out is not None:
                        out.close()
                    out, size = open(directory / f"corpus-{len(list(directory.glob('*.jsonl'))):05d}.jsonl", "wb"), 0
                line = b'{"text": "# copy %d of %s\\n' % (copies, name.encode()) + body + b'"}\n'
                out.write(line)
                size += len(line)
                written += len(line)
            copies += 1
    finally:
        if out is not None:
            out.close()
    facts = {"target_bytes": target_bytes, "bytes": written, "copies": copies, "documents": copies * len(files)}
    facts["write_s"] = time.monotonic() - started
    done.write_text(json.dumps(facts))
    return facts


def train_sampled(run_dir: Path, dataset: Path | None, *overrides: str) -> MemorySampler:
    """recipes/tiny.yaml with 2 learners for 300 steps, its memory sampled (kept in RUN_DIR.memory.json)."""
    common = ["learners.count=2", "run.max_steps=300", "eval.every_steps=100"]

    def watch(pid: int) -> MemorySampler:
        return MemorySampler(pid, run_dir, dataset)

    done = train(run_dir, *overrides, *common, watch=watch)
    sampler: MemorySampler = done.watcher
    (run_dir.parent / f"{run_dir.name}.memory.json").write_text(
        json.dumps({"peaks": sampler.peaks, "learners": sampler.learners, "series": sampler.series})
    )
    return sampler


def memory(args: argparse.Namespace, work: Path) -> None:
    corpora = [("small", int(args.small_mb * MB)), ("large", int(args.scale_gb * GB))]
    rows = []
    facts: dict[str, dict[str, Any]] = {}
    for name, target in corpora:
        say(f"writing the {name} corpus (~{target / MB:,.0f} MB) ...")
        facts[name] = make_corpus(work / f"corpus-{name}", target)
        dataset = work / f"dataset-{name}"
        say(f"prepare {name} corpus ...")
        facts[name]["prepare"] = prepare([str(work / f"corpus-{name}")], dataset, "bytes")
        say(f"prepared in {facts[name]['prepare']['wall_s']:.1f} s; training ...")
        sampler = train_sampled(work / f"run-{name}", dataset, "data.source=prepared", f"data.path={dataset}")
        rows.append({"corpus": name, "source": "prepared", "sampler": sampler, "run_dir": work / f"run-{name}"})
        # The old path holds about twice the corpus in the driver and once more in Ray's object store.
        if psutil.virtual_memory().available < TEXT_MEMORY_FACTOR * facts[name]["bytes"]:
            say(f"not enough free memory to read the {name} corpus whole: its data.source=text run is left out")
            continue
        say(f"training from the {name} corpus read whole (data.source=text) ...")
        paths = f"data.paths=['{work / f'corpus-{name}'}/*.jsonl']"
        sampler = train_sampled(work / f"run-{name}-text", None, "data.source=text", paths)
        rows.append({"corpus": name, "source": "text", "sampler": sampler, "run_dir": work / f"run-{name}-text"})
    lines = [
        "Corpora: JSONL files made from the standard library's .py files, copy after copy, each document a "
        "file's text after a line `# copy K of PATH` (so no two documents are the same); prepared with "
        f"`dlc prepare DIR --out D --tokenizer bytes` on {cores()} worker(s) (uint16 tokens, 2 bytes each). "
        f"Training: `dlc train {RECIPE} data.source=prepared data.path=D learners.count=2 run.max_steps=300 "
        "eval.every_steps=100`, and for reference each corpus read whole by the driver, the old way "
        "(`data.source=text data.paths=['DIR/*.jsonl']`: its JSON text as bytes, one token a byte). Memory "
        "sampled every 0.5 s with psutil, the peak of each figure over the run (MiB = 2^20 bytes): RSS / USS / "
        "PSS / anonymous (RSS less the pages that map files or shared memory). *Dataset in a learner*: the "
        "most of a learner's RSS that maps the dataset's shard files (/proc/PID/smaps); *all processes*: the "
        "PSS of every process under the driver (Ray's included) summed.",
        "",
        "| corpus | JSONL on disk (MB) | data | tokens | prepare (s) | prepare MB/s of text | "
        "driver (MiB) | learner, the larger (MiB) | dataset in a learner (MiB) | "
        "evaluator RSS (MiB) | all processes PSS (MiB) | steps/s per learner |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def mib(value: int | None) -> str:
        return "-" if value is None else f"{value / MIB:,.0f}"

    def figures(get: Callable[[str], int | None]) -> str:
        return f"**{mib(get('rss'))}** / {mib(get('uss'))} / {mib(get('pss'))} / {mib(get('anon'))}"

    for r in rows:
        f, s = facts[r["corpus"]], r["sampler"]
        manifest, took = f["prepare"]["manifest"], f["prepare"]["wall_s"]
        prepared = r["source"] == "prepared"
        how = (
            f"prepared | {tokens(manifest):,} | {took:.1f} | {text_bytes(manifest) / MB / took:.1f}"
            if prepared
            else f"text (old path) | {f['bytes']:,} | - | -"
        )
        lines.append(
            f"| {r['corpus']} | {f['bytes'] / MB:,.0f} | {how} | {figures(partial(s.peak, 'driver'))} | "
            f"{figures(s.learner_peak)} | {mib(s.learner_peak('dataset')) if prepared else '-'} | "
            f"{mib(s.peak('evaluator', 'rss'))} | {mib(s.peak('all', 'pss'))} | {stepping(r['run_dir'])[1]:.1f} |"
        )
    prepared = {r["corpus"]: r["sampler"] for r in rows if r["source"] == "prepared"}
    large, small = prepared["large"], prepared["small"]
    driver = large.peak("driver", "rss")
    ratio = (large.learner_peak("rss") or 0) / (small.learner_peak("rss") or 1)
    text = {r["corpus"]: r["sampler"] for r in rows if r["source"] == "text"}

    def whole(corpus: str) -> str:
        got = text.get(corpus)
        return "not run (too little free memory)" if got is None else f"{mib(got.peak('driver', 'rss'))} MiB"

    lines += [
        "",
        f"- driver peak RSS at {facts['large']['bytes'] / GB:.1f} GB: **{mib(driver)} MiB** "
        f"(target: under 1 GB: {'met' if driver is not None and driver < GB else 'NOT met'}); "
        f"at {facts['small']['bytes'] / MB:.0f} MB: {mib(small.peak('driver', 'rss'))} MiB. Reading the corpus "
        f"whole instead (data.source=text): {whole('large')} at {facts['large']['bytes'] / GB:.1f} GB, "
        f"{whole('small')} at {facts['small']['bytes'] / MB:.0f} MB.",
        f"- learner peak RSS, large / small corpus: **{ratio:.3f}** "
        f"(target: within 10%: {'met' if abs(ratio - 1) <= 0.10 else 'NOT met'}).",
        f"- corpus writing: {facts['large']['copies']} copies of the standard library, "
        f"{facts['large']['documents']:,} documents, in {facts['large']['write_s']:.0f} s.",
    ]
    options = ["--only", "memory", "--scale-gb", f"{args.scale_gb:g}", "--small-mb", f"{args.small_mb:g}"]
    record("Prepared data: memory at scale", options, lines, args, keyed=("scale_gb",))


# ---------------------------------------------------------------------------------------------
# 3. BPE against bytes at equal wall time


def stepping(run_dir: Path) -> tuple[float, float]:
    """(seconds from run start to every learner stepping, mean steady steps/s per learner) of a finished run."""
    events = read_events(run_dir)
    started = next(e["t"] for e in events if e["kind"] == "run_started")
    first: dict[int, float] = {}
    for e in events:
        if e["kind"] == "learner_training" and not e.get("incarnation"):
            first.setdefault(e["learner"], e["t"])
    recipe = yaml.safe_load((run_dir / "recipe.yaml").read_text())
    per_step = recipe["learners"]["batch_size"] * recipe["learners"]["seq_len"]
    steady = [x["steady_tokens_per_s"] for x in run_summary(run_dir)["learners"]]
    return max(first.values()) - started, statistics.mean(steady) / per_step


def quality(args: argparse.Namespace, work: Path) -> None:
    paths = {tokenizer: work / f"stdlib-{slug(tokenizer)}" for tokenizer in TOKENIZERS}
    datasets = {}
    for tokenizer, out in paths.items():
        say(f"prepare stdlib {tokenizer} ...")
        datasets[tokenizer] = prepare(["stdlib"], out, tokenizer, "--seed", "0", "--eval-fraction", "0.02")
    held = {t: (d["manifest"].eval.documents, d["manifest"].eval.text_bytes) for t, d in datasets.items()}
    assert len(set(held.values())) == 1, f"the held-out splits differ: {held}"
    schedule: dict[str, tuple[int, float, float]] = {}
    for tokenizer in TOKENIZERS:
        probe = work / f"probe-{slug(tokenizer)}"
        say(f"probe {tokenizer}: a warm-up run, then {PROBE_STEPS} steps ...")
        data = ["data.source=prepared", f"data.path={paths[tokenizer]}", "eval.every_steps=1000000"]
        # The warm-up fills the compilation cache, so the probe starts up as the measured runs will.
        train(work / f"warm-{slug(tokenizer)}", *data, "run.max_steps=3")
        train(probe, *data, f"run.max_steps={PROBE_STEPS}")
        startup_s, rate = stepping(probe)
        schedule[tokenizer] = (max(1, int(rate * (args.wall_s - startup_s))), startup_s, rate)
        say(f"  {rate:.2f} steps/s per learner after {startup_s:.1f} s: schedule {schedule[tokenizer][0]} steps")
    rows = []
    for seed in args.seeds:
        for tokenizer in TOKENIZERS:  # alternated, so a slow hour of the machine falls on both
            steps = schedule[tokenizer][0]
            run_dir = work / f"run-{slug(tokenizer)}-seed{seed}"
            say(f"train {tokenizer} seed {seed}: {args.wall_s:g} s ...")
            train(
                run_dir,
                "data.source=prepared",
                f"data.path={paths[tokenizer]}",
                f"run.seed={seed}",
                "run.max_steps=null",
                f"run.max_wall_s={args.wall_s:g}",
                f"inner.schedule_steps={steps}",
                f"eval.every_steps={max(1, steps // 3)}",
            )
            summary = run_summary(run_dir)
            recipe = yaml.safe_load((run_dir / "recipe.yaml").read_text())
            steady = sum(x["steady_tokens_per_s"] for x in summary["learners"])
            rows.append(
                {
                    "tokenizer": tokenizer,
                    "seed": seed,
                    "params": summary["params"],
                    "vocab": recipe["model"]["vocab_size"],
                    "schedule": steps,
                    "steps": statistics.mean(x["step"] for x in summary["learners"]),
                    "tokens_per_s": steady,
                    "bytes_per_token": datasets[tokenizer]["manifest"].eval.bytes_per_token,
                    "loss": summary["eval_loss_final"],
                    "bpb": summary["eval_bpb_final"],
                    "wall_s": summary["wall_s"],
                }
            )
            say(f"  eval bits/byte {rows[-1]['bpb']:.3f} at step {rows[-1]['steps']:.0f}")
    lines = [
        f"`dlc prepare stdlib --tokenizer T --seed 0 --eval-fraction 0.02` for bytes and bpe:4096 (the same "
        f"{held['bytes'][0]} held-out documents, {held['bytes'][1] / MB:.2f} MB, in both), then "
        f"`dlc train {RECIPE} data.source=prepared data.path=D run.seed=S run.max_steps=null "
        f"run.max_wall_s={args.wall_s:g} inner.schedule_steps=N eval.every_steps=N/3` (4 learners, 16 x 64 "
        "tokens a step each). N is each tokenizer's steady steps/s per learner in a probe run of "
        f"{PROBE_STEPS} steps (after a warm-up run that fills the compilation cache) times the wall time left "
        "after the probe's start-up ("
        + "; ".join(f"{t}: {r:.2f} steps/s, {s:.0f} s start-up" for t, (_, s, r) in schedule.items())
        + "); past N steps the learning rate stays at its floor. Bits per byte = eval loss (nats per token) "
        "/ ln 2 / the held-out split's bytes per token.",
        "",
        "| tokenizer | seed | parameters | vocabulary | schedule N | steps reached (per learner) | "
        "tokens/s (all learners, steady) | text bytes/s | eval bytes/token | final eval loss (nats/token) | "
        "final eval bits/byte |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['tokenizer']} | {r['seed']} | {r['params']:,} | {r['vocab']:,} | {r['schedule']} | "
            f"{r['steps']:.0f} | {r['tokens_per_s']:,.0f} | {r['tokens_per_s'] * r['bytes_per_token']:,.0f} | "
            f"{r['bytes_per_token']:.3f} | {r['loss']:.3f} | **{r['bpb']:.3f}** |"
        )
    if len(args.seeds) > 1:
        for tokenizer in TOKENIZERS:
            bpb = [r["bpb"] for r in rows if r["tokenizer"] == tokenizer]
            lines.append(f"| {tokenizer} | mean | | | | | | | | | **{statistics.mean(bpb):.3f}** |")
    options = ["--only", "quality", "--wall-s", f"{args.wall_s:g}", "--seeds", ",".join(map(str, args.seeds))]
    record("Prepared data: BPE against bytes at equal wall time", options, lines, args, keyed=("wall_s",))


# ---------------------------------------------------------------------------------------------


def record(
    title: str, options: list[str], lines: list[str], args: argparse.Namespace, keyed: tuple[str, ...] = ()
) -> None:
    lines = [
        *lines,
        "",
        f"The machine's load average (1 min) was {args.load_start:.1f} when this measurement started and "
        f"{os.getloadavg()[0]:.1f} when it ended (other processes share its {cores()} cores).",
    ]
    heading = runner.heading(title, args.parser, args, keyed)
    provenance = runner.Provenance.here(runner.bench_command("data.py", options))
    runner.record(heading, provenance, "\n".join(lines), args.results)


PARTS: dict[str, Callable[[argparse.Namespace, Path], None]] = {
    "throughput": throughput,
    "memory": memory,
    "quality": quality,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=list(PARTS), help="run one measurement (default: all three)")
    ap.add_argument("--quick", action="store_true", help="smaller sizes: a few minutes in all")
    ap.add_argument("--repeats", type=int, default=3, help="throughput: prepares of each configuration")
    ap.add_argument("--scale-gb", type=float, default=2.0, help="memory: the large corpus's JSONL size")
    ap.add_argument("--small-mb", type=float, default=100.0, help="memory: the small corpus's JSONL size")
    ap.add_argument("--wall-s", type=float, default=150.0, help="quality: run.max_wall_s of every run")
    ap.add_argument("--seeds", default="0,1", help="quality: run.seed of the runs, comma-separated")
    ap.add_argument("--keep", help="keep corpora, datasets and runs here (default: a temporary directory)")
    ap.add_argument("--results", default=str(runner.RESULTS))
    args = ap.parse_args()
    if args.quick:
        args.repeats, args.scale_gb, args.small_mb, args.wall_s, args.seeds = 1, 0.2, 20.0, 60.0, "0"
    with runner.refusing_bad_input():
        args.seeds = runner.numbers("--seeds", args.seeds, int, sign="any")
    args.parser = ap
    with tempfile.TemporaryDirectory(prefix="dlc-bench-data-") as tmp:
        root = Path(args.keep or tmp).resolve()
        for name, part in PARTS.items():
            if args.only in (None, name):
                work = root / name
                work.mkdir(parents=True, exist_ok=True)
                say(f"{name} ...")
                args.load_start = os.getloadavg()[0]
                part(args, work)


if __name__ == "__main__":
    main()
