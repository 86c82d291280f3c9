"""Running a protocol over a dataset: chunked, resumable, sharded over torchrun's ranks.

The dataset is cut into chunks of `batch_size` examples (chunk i holds examples
i * batch_size ...). Every finished (method, chunk) is stored as its own small JSON file in
a work folder next to the output (`results.json.parts/`), so an interrupted run resumes
where it stopped and never recomputes a finished chunk. A stored chunk is trusted only if
it carries the digest of the run's settings, its method and its range of examples, and
its records have the protocol's keys, types and ranges (`EvaluationProtocol.fields`);
any other (tampered, damaged, or copied from another run) is computed again. Under
torchrun, chunk i belongs to rank i mod world size; the ranks' records are gathered on
rank 0, which writes the results JSON (atomically) with a markdown table and a PNG of the
curves next to it. Chunks are the same whatever the number of processes, so a sharded run
gives exactly the numbers of a single-process run.

Every number that ranks methods gets a bootstrap standard error, and the methods within
noise of the best are named per number (explain.evaluation.bootstrap), from the same
per-example records.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from explain.errors import ExplainError, InputError, OptionError
from explain.evaluation.bootstrap import (
    LEVEL,
    ROUNDS,
    replicates,
    standard_error,
    tied_with_best,
)
from explain.evaluation.distributed import Group, process_group
from explain.evaluation.protocol import (
    EvaluationProtocol,
    Field,
    Records,
    concatenate_records,
    records_problem,
)
from explain.evaluation.report import markdown_table, plot_results
from explain.export import atomic_write
from explain.rules import get_method

__all__ = ["run_evaluation", "weights_digest", "work_folder"]


def weights_digest(model: nn.Module) -> str:
    """SHA-256 of a model's state (names and bytes): chunks computed with other weights
    under the same model name are never reused."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        data = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(data.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def results_path(output: str | Path) -> Path:
    """`output` as the results JSON's path; refused where it ends in .md or .png, the
    suffixes of the table and the plot written next to it (they would overwrite it)."""
    output = Path(output)
    if output.suffix.lower() in (".md", ".png"):
        raise OptionError(
            f"the output {output} would be overwritten by the results' {output.suffix} "
            f"written next to it: name the results JSON, e.g. {output.with_suffix('.json')}"
        )
    return output


def work_folder(output: str | Path) -> Path:
    """Where the finished chunks of the run that writes `output` are kept."""
    output = Path(output)
    return output.with_name(output.name + ".parts")


def run_evaluation(
    protocol: EvaluationProtocol,
    dataset: Sequence[Any],
    methods: Sequence[str],
    output: str | Path,
    *,
    model_name: str,
    batch_size: int = 16,
    limit: int | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Evaluate every method in `methods` on the first `limit` examples of `dataset`.

    Writes `output` (JSON), `output` with suffix .md (a table) and .png (the curves), and
    returns the results dict: `{"protocol", "model", "dataset", "n", "scale", "results":
    {METHOD: summary}, "ties": {KEY: [METHOD, ...]}, "bootstrap": {"rounds", "level"},
    "skipped": {METHOD: reason}}`. Each summary holds `standard_errors: {KEY: se}` for
    the protocol's ranking columns; `ties[KEY]` lists the best method and those within
    noise of it. A method that fails on this model (e.g. one the model family does not
    support) is skipped with its reason instead of stopping the run; when every method
    is skipped, InputError says why (after writing the files, which record the reasons).
    An `output` ending in .md or .png is refused (the table or plot would overwrite it).
    Joins torchrun's process group when launched by torchrun.
    """
    for method in methods:
        get_method(method)  # unknown names fail before any work
    if batch_size < 1:
        raise OptionError(f"batch_size must be a positive number, got {batch_size}")
    if limit is not None and limit < 1:
        raise OptionError(f"limit must be a positive number, got {limit}")
    count = len(dataset) if limit is None else min(limit, len(dataset))
    if count == 0:
        raise InputError("the dataset is empty: nothing to evaluate")
    name = getattr(dataset, "name", type(dataset).__name__)
    output = results_path(output)
    work = work_folder(output)
    fingerprint = {
        "protocol": protocol.name,
        "model": model_name,
        "weights": weights_digest(protocol.explainer.model),
        "dataset": name,
        "batch_size": batch_size,
        "settings": protocol.settings(),
    }
    _check_fingerprint(work, fingerprint)
    run = _run_digest(fingerprint)
    chunks = [(start, min(start + batch_size, count)) for start in range(0, count, batch_size)]
    with process_group() as group:
        done, failed = _run_chunks(protocol, dataset, methods, chunks, work, run, group, progress)
        gathered = group.gather((done, failed))
        results = None
        if group.is_main:
            assert gathered is not None
            results = _merge(protocol, methods, chunks, gathered)
            results = {
                "protocol": protocol.name,
                "model": model_name,
                "dataset": name,
                "n": count,
                "scale": protocol.scale(),
                **results,
            }
            _write(results, output, protocol)
        results = group.broadcast(results)
    if not results["results"]:  # an empty table is no result: say why, not exit 0
        reasons = "; ".join(f"{m}: {why}" for m, why in results["skipped"].items())
        raise InputError(f"no method could run on this data ({reasons})")
    return results


def _check_fingerprint(work: Path, fingerprint: dict[str, Any]) -> None:
    """Refuse to resume from chunks that were computed with other settings."""
    path = work / "run.json"
    if path.exists():
        try:
            stored = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ExplainError(
                f"{path} is damaged ({error}), so the chunks next to it cannot be trusted; "
                f"delete {work} to start the run over"
            ) from None
        if stored != fingerprint:
            raise ExplainError(
                f"{work} holds chunks of a different run ({stored}); delete that folder or "
                "choose another output file"
            )
        return
    with atomic_write(path, "w") as handle:
        json.dump(fingerprint, handle, indent=1)


def _run_digest(fingerprint: dict[str, Any]) -> str:
    """SHA-256 of a run's settings, stored in each of its chunks: a chunk copied from
    another run's folder is not taken for one of this run's."""
    return hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()


def _run_chunks(
    protocol: EvaluationProtocol,
    dataset: Sequence[Any],
    methods: Sequence[str],
    chunks: list[tuple[int, int]],
    work: Path,
    run: str,
    group: Group,
    progress: bool,
) -> tuple[dict[tuple[str, int], Records], dict[str, str]]:
    """This rank's chunks: loaded when already finished, else computed and stored."""
    mine = [index for index in range(len(chunks)) if group.owns(index)]
    done: dict[tuple[str, int], Records] = {}
    failed: dict[str, str] = {}
    bar = tqdm(
        total=len(mine) * len(methods),
        desc=f"{protocol.name} (rank {group.rank})" if group.world_size > 1 else protocol.name,
        unit="chunk",
        disable=not progress or not group.is_main,
    )
    with bar:
        for index in mine:
            start, stop = chunks[index]
            examples = None
            for method in methods:
                path = work / method / f"{start:08d}-{stop:08d}.json"
                label = {"run": run, "method": method, "examples": [start, stop]}
                stored = _stored_chunk(path, label, protocol.fields, stop - start)
                if stored is not None:
                    done[method, index] = stored
                elif method not in failed:
                    if examples is None:
                        examples = [dataset[i] for i in range(start, stop)]
                    try:
                        records = protocol.evaluate(method, examples, seed=start)
                    except (ExplainError, NotImplementedError, TypeError, ValueError) as error:
                        failed[method] = f"{type(error).__name__}: {error}"
                        print(f"explain: {method} skipped: {failed[method]}", file=sys.stderr)
                    else:
                        with atomic_write(path, "w") as handle:
                            json.dump({**label, "records": records}, handle, allow_nan=False)
                        done[method, index] = records
                bar.update(1)
    return done, failed


def _stored_chunk(
    path: Path, label: dict[str, Any], fields: Mapping[str, Field], examples: int
) -> Records | None:
    """The finished chunk at `path`, or None when there is none yet or it cannot be
    trusted, in which case it is recomputed: cut short or not JSON, written by another run
    (its `label` of run digest, method and example range differs), or records that the
    protocol could not have written (keys, lengths, types and ranges: `fields`)."""
    if not path.exists():
        return None
    try:
        stored = json.loads(path.read_text(), parse_constant=_no_constant)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as error:
        problem = f"it is not JSON ({type(error).__name__})"
    else:
        if not isinstance(stored, dict) or set(stored) != {*label, "records"}:
            problem = "it is not a chunk of this version of explain"
        elif any(stored[key] != value for key, value in label.items()):
            problem = "it belongs to another run, method or range of examples"
        else:
            problem = records_problem(stored["records"], fields, examples)
            if problem is None:
                return stored["records"]
    print(f"explain: {path} is damaged ({problem}); computing that chunk again", file=sys.stderr)
    return None


def _no_constant(name: str) -> None:
    """json's hook for NaN and Infinity, which no chunk holds: refuse the file."""
    raise ValueError(f"{name} in a chunk")


def _merge(
    protocol: EvaluationProtocol,
    methods: Sequence[str],
    chunks: list[tuple[int, int]],
    gathered: list[tuple[dict[tuple[str, int], Records], dict[str, str]]],
) -> dict[str, Any]:
    done: dict[tuple[str, int], Records] = {}
    skipped: dict[str, str] = {}
    for rank_done, rank_failed in gathered:
        done.update(rank_done)
        for method, reason in rank_failed.items():
            skipped.setdefault(method, reason)
    records = {
        method: concatenate_records([done[method, index] for index in range(len(chunks))])
        for method in methods
        if method not in skipped
    }
    results = {method: protocol.summarize(r) for method, r in records.items()}
    ranked = {key: column.better for key, column in protocol.columns.items() if column.better}
    ties: dict[str, list[str]] = {}
    if results:
        # The same draws for every method: they depend only on the number of examples.
        drawn = {method: replicates(protocol, r, ranked) for method, r in records.items()}
        for method, summary in results.items():
            summary["standard_errors"] = {key: standard_error(drawn[method][key]) for key in ranked}
        for key, better in ranked.items():
            values = {method: summary[key] for method, summary in results.items()}
            ties[key] = tied_with_best(values, {m: drawn[m][key] for m in results}, better)
    return {
        "results": results,
        "ties": ties,
        "bootstrap": {"rounds": ROUNDS, "level": LEVEL},
        "skipped": {m: skipped[m] for m in methods if m in skipped},
    }


def _write(results: dict[str, Any], output: Path, protocol: EvaluationProtocol) -> None:
    with atomic_write(output, "w") as handle:
        # Standard JSON: a number that is not finite (none should be) is written as null.
        json.dump(_finite(results), handle, indent=1, allow_nan=False)
    title = f"# {results['protocol']}: {results['model']} on {results['dataset']}\n\n"
    table = markdown_table(results, protocol.columns)
    with atomic_write(output.with_suffix(".md"), "w") as handle:
        handle.write(title + f"n = {results['n']}\n\n" + table)
    if results["results"]:
        plot_results(results, output.with_suffix(".png"))


def _finite(value: Any) -> Any:
    """`value` with every float that is not finite replaced by None (JSON's null)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value
