"""Result tables and figures, from the per-site results files that runs write.

Every site writes <workspace>/<site>/prrfl/<run_name>/results.json. `build_report` finds them under
any number of workspaces, flattens them into one tidy table (results_long.csv: one row per method,
seed, site, split and metric) and builds every table from that table and every figure from the
per-epoch histories, so a comparison can be rebuilt from the files alone, long after the runs:

* the per-site table of the TMI paper (Table II for dermoscopy: F1 / AUC; Table III for prostate
  MRI: Dice / IoU): each site's test metrics at its best validation round and their average, mean ±
  std over seeds, with a paired test of each method's per-(site, seed) primary metric against a reference;
* Table X: the out-of-distribution cohort scored by one site's best model (tasks that have one);
* retrogress: the test metric a site loses right after a communication round (Fig. 1 curves and a
  bar chart), the failure PRR is designed to remove.

A report covers one task: metric names, the table's name and the out-of-distribution cohort come
from the task (`registry.task_class`).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import logging
import math
import os
import re
import warnings
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from prrfl.crosseval import CROSSEVAL_FILE
from prrfl.metrics import download_drops, improves, label, nanmean, shared_model_drops
from prrfl.registry import task_class
from prrfl.storage import atomic_write_bytes, existing_json, find_json, load_json, save_text
from prrfl.summary import results_table

log = logging.getLogger(__name__)

RESULTS_GLOB = "**/prrfl/*/results.json"
LONG_FIELDS = ("method", "seed", "run_id", "site", "cohort", "split", "metric", "value")
RETROGRESS_FIELDS = ("method", "seed", "run_id", "site", "cohort", "model", "round", "before", "after", "drop")
WILCOXON_MIN_PAIRS = 6  # below this the signed-rank test cannot reach p < 0.05: use a paired t-test
LEGACY_TASK = "derm"  # results files written before they named their task hold dermoscopy runs
MISSING = "–"


# ----- the runs under a folder, for `prrfl results` -------------------------------------------
RESULTS_FILE = "results.json"


@dataclass(frozen=True)
class RunResults:
    """One run's per-site summaries: the server's results.json when the folder holds one (it adds each
    site's participation), else the sites' own files."""

    name: str
    run_id: str
    task: str
    source: str  # where the numbers come from, for the table's title
    summaries: dict[str, dict[str, Any]]
    crosseval: dict[str, Any] | None = None  # the crosseval.json beside the server's results.json (FLARE's cross-site evaluation)

    def title(self) -> str:
        return f"{self.name} (run {self.run_id}, task {self.task}): {self.source}"

    def table(self) -> str:
        """The per-site table; then the cross-site matrix of the task's primary metric, when the run has one."""
        facts = task_class(self.task)
        table = results_table(self.summaries, facts.table_metrics, facts.table_note)
        if self.crosseval:
            matrix = cross_site_table([self.crosseval], self.crosseval["method"], facts.metric_names[0], facts.site_names)
            table += f"\n\nCross-site evaluation: each site's best model (rows) on each site's test split\n\n{matrix}"
        return table


def server_run(path: Path, data: dict[str, Any]) -> RunResults:
    """The run of a server's results.json (`data`, read from `path`), with the crosseval.json beside it."""
    config = data["config"]
    crosseval = existing_json(path.with_name(CROSSEVAL_FILE))
    return RunResults(
        config.get("run_name", "?"),
        str(data.get("run_id")),
        config.get("task", LEGACY_TASK),
        str(path),
        data["sites"],
        None if crosseval is None else load_json(crosseval),
    )


def results_kind(data: Any) -> str | None:
    """'server' for the workflow's results.json, 'site' for a site's, None for a file of another shape."""
    if not isinstance(data, dict):
        return None
    sites = data.get("sites")
    if isinstance(sites, dict) and isinstance(data.get("config"), dict) and all(isinstance(s, dict) for s in sites.values()):
        return "server"
    return "site" if isinstance(data.get("site"), str) and "best" in data else None


def find_runs(folder: str | Path) -> tuple[list[RunResults], list[str]]:
    """The runs whose results.json files lie anywhere under `folder` (or `folder` itself, a results.json),
    and a note for every results.json skipped (unreadable, or not a prrfl run's).

    Searching at any depth covers every workspace this product writes: a simulator workspace
    (server/simulate_job/, site-N/prrfl/<run>/), a `prrfl run` workspace (<job>/ and <job>.state/ in it),
    a POC workspace (<project>/prod_00/: the participants' prrfl/<run>/ folders and the admin's downloads
    in transfer/<job id>/) and a `prrfl deploy poc` folder (the same, and result/). The same run is
    found there several times (the workspace copy, the state copy, the download): it is one run, keyed
    by its run id; a site's copies agree, or the one with more rounds is the newer. Runs come by name,
    then oldest first (e.g. a run set aside as <run>.replaced-<time> before the run that replaced it)."""
    folder = Path(folder)
    files = [folder] if folder.is_file() else find_json(folder, RESULTS_FILE, recursive=True)
    servers: dict[str, tuple[Path, dict[str, Any]]] = {}
    sites: dict[str, dict[str, tuple[Path, dict[str, Any]]]] = defaultdict(dict)
    notes = []
    for path in files:
        try:
            data = load_json(path)
        except (OSError, ValueError) as e:
            notes.append(f"{path}: skipped, not readable as JSON ({e})")
            continue
        kind = results_kind(data)
        if kind == "server":
            servers.setdefault(str(data.get("run_id")), (path, data))
        elif kind == "site":
            copies, site = sites[str(data.get("run_id") or data.get("run_name"))], data["site"]
            if site not in copies or (data.get("rounds_completed") or 0) > (copies[site][1].get("rounds_completed") or 0):
                copies[site] = (path, data)
        else:
            notes.append(
                f"{path}: skipped, not a prrfl results file (neither the server's 'sites' and 'config' nor a site's 'site' and 'best')"
            )
    runs = []  # (name, when written, run)
    for run_id in servers.keys() | sites.keys():
        if run_id in servers:
            path, data = servers[run_id]
            run = server_run(path, data)
            written = path.stat().st_mtime
        else:
            found = sites[run_id]
            first = next(iter(found.values()))[1]
            where = Path(os.path.commonpath([p.parent for p, _ in found.values()]))
            source = f"the sites' results.json under {where} (no server results.json)"
            run = RunResults(
                first.get("run_name", "?"), run_id, first.get("task", LEGACY_TASK), source, {s: d for s, (_, d) in found.items()}
            )
            written = max(p.stat().st_mtime for p, _ in found.values())
        runs.append((run.name, written, run))
    return [run for *_, run in sorted(runs, key=lambda r: r[:2])], notes


# ----- discovery ---------------------------------------------------------------------------
def variant_label(method: str, method_args: dict[str, Any]) -> str:
    """`prr` for the method with its defaults; `prr[cpa_global=false,det_enabled=false]` for a run that sets
    options (e.g. a Table IV ablation), so that such runs are reported apart from the method's own."""
    if not method_args:
        return method
    return f"{method}[{','.join(f'{k}={json.dumps(v)}' for k, v in sorted(method_args.items()))}]"


@dataclass(frozen=True)
class SiteResult:
    """One site's results file of one run."""

    path: Path
    task: str
    method: str
    seed: int
    run_id: str
    site: str
    cohort: str
    rounds_completed: int
    best: dict[str, Any] | None
    last: dict[str, Any] | None
    ood: dict[str, float] | None
    history: list[dict[str, Any]]
    class_counts: list[int] | None = None  # training images (voxels) per class
    reported_model: str | None = None  # the role whose metrics these are (PRR: "personal"); None: not recorded
    select_from_round: int = 0  # the first round the best-on-validation selection considered

    @classmethod
    def load(cls, path: Path) -> SiteResult | None:
        """None for the server's run summary, which lives in the same folder layout. `method` is the run's
        label in every table: the method, with the options set for the run in brackets (an ablation)."""
        data = load_json(path)
        if "site" not in data:
            return None
        keys = ("seed", "run_id", "site", "cohort", "rounds_completed", "best", "last", "ood", "history", "class_counts", "reported_model")
        method = variant_label(data.get("method"), data.get("method_args") or {})
        found = {k: data.get(k) for k in keys}
        return cls(
            path=path, task=data.get("task", LEGACY_TASK), method=method, select_from_round=data.get("select_from_round", 0), **found
        )

    def other_model_results(self) -> list[SiteResult]:
        """The models the run evaluated every round beside the reported one (PRR's deputy D beside P), each as
        a result of its own, labelled `<method>/<role>`: its rounds' valid and test metrics, its best round on
        validation by the same rule as the reported model's, its last round. Runs recorded before the other
        models were (no `other_models` in their rounds) give none."""
        rounds = [h for h in self.history if h["kind"] == "round" and h.get("other_models")]
        primary = task_class(self.task).metric_names[0]
        out = []
        for role in sorted({role for h in rounds for role in h["other_models"]}):
            own = [{"kind": "round", "round": h["round"], "epochs_done": h["epochs_done"], **h["other_models"][role]} for h in rounds]
            best = None
            for h in own:  # the site loop's rule (prrfl.metrics.improves)
                if improves(None if best is None else best["valid"][primary], h["valid"][primary], h["round"], self.select_from_round):
                    best = {"round": h["round"], "valid": h["valid"], "test": h["test"]}
            method = f"{self.method}/{role}"
            out.append(dataclasses.replace(self, method=method, best=best, last=own[-1], ood=None, history=own, reported_model=role))
        return out

    def identity(self) -> dict[str, Any]:
        """The columns that name this site's run in every tidy table."""
        return {"method": self.method, "seed": self.seed, "run_id": self.run_id, "site": self.site, "cohort": self.cohort}

    def evaluations(self) -> dict[str, dict[str, float]]:
        """The metric sets a run reports, by split name (absent ones left out)."""
        best, last = self.best or {}, self.last or {}
        found = {"best_valid": best.get("valid"), "best_test": best.get("test"), "last_test": last.get("test"), "ood": self.ood}
        return {split: metrics for split, metrics in found.items() if metrics}


def find_results(workspaces: Iterable[str | Path], methods: Sequence[str] | None = None, task: str | None = None) -> list[SiteResult]:
    """Every site results file under the workspaces (of the given methods and task only, if any).

    A file reached through two overlapping workspaces counts once. The other models a run recorded beside
    the reported one come as results of their own (`SiteResult.other_model_results`: "prr/deputy" beside
    "prr"). Two runs of one method with the same seed are refused: the paired test matches runs by seed, and silently picking one would hide
    which run the table shows.
    """
    found: dict[tuple[str, str, str], SiteResult] = {}
    for ws in workspaces:
        for path in find_json(ws, RESULTS_GLOB):
            result = SiteResult.load(path)
            if result is not None and (not methods or result.method in methods) and (not task or result.task == task):
                found.setdefault((result.method, result.run_id, result.site), result)
    loaded = list(found.values())
    loaded += [other for r in loaded for other in r.other_model_results()]
    results = sorted(loaded, key=lambda r: (r.task, r.method, r.seed, r.cohort, r.site))
    runs: dict[tuple[str, str, int], dict[str, Path]] = defaultdict(dict)
    for r in results:
        runs[(r.task, r.method, r.seed)].setdefault(r.run_id, r.path.parent)
    for (task_name, method, seed), by_id in runs.items():
        if len(by_id) > 1:
            listing = ", ".join(f"{run_id} ({folder})" for run_id, folder in sorted(by_id.items()))
            raise ValueError(
                f"method '{method}' on task '{task_name}' has {len(by_id)} runs with seed {seed}: {listing}; report one of them"
            )
    return results


def method_order(results: Sequence[SiteResult], methods: Sequence[str] | None, reference: str) -> list[str]:
    """The requested methods that have results, in the requested order; else the reference first."""
    present = {r.method for r in results}
    if methods:
        missing = [m for m in methods if m not in present]
        if missing:
            log.warning("no results for method(s) %s: left out of the report", ", ".join(missing))
        # each requested method's other models (its label + "/<role>") right after it
        return [x for m in methods if m in present for x in (m, *sorted(d for d in present if d.startswith(f"{m}/")))]
    return sorted(present, key=lambda m: (m.split("/")[0] != reference, m.split("/")[0], m))  # "prr/deputy" after "prr"


# ----- tidy tables -------------------------------------------------------------------------
def long_rows(results: Sequence[SiteResult]) -> list[dict[str, Any]]:
    """One row per (method, seed, site, split, metric): the tidy form every table is built from."""
    rows = []
    for r in results:
        for split, metrics in r.evaluations().items():
            for metric in sorted(metrics):
                rows.append({**r.identity(), "split": split, "metric": metric, "value": metrics[metric]})
    return rows


def retrogress_rows(results: Sequence[SiteResult], metric: str, model: str = "reported") -> list[dict[str, Any]]:
    """One row per site and communication round r >= 1: the test metric of the last local epoch of
    round r-1 (just before communication), right after the download of round r, and the drop; of the
    site's reported model, or with model="shared" of the model it uploads and the download overwrites
    (PRR's deputy; the reported model for most methods; recorded by newer runs only)."""
    drops = {"reported": download_drops, "shared": shared_model_drops}[model]
    rows = []
    for r in results:
        for rnd, (before, after) in drops(r.history, metric).items():
            rows.append({**r.identity(), "model": model, "round": rnd, "before": before, "after": after, "drop": before - after})
    return rows


def write_csv(rows: Sequence[dict[str, Any]], fields: Sequence[str], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return path


def values_by_method(rows: Sequence[dict[str, Any]], split: str, metric: str) -> dict[str, dict[tuple[str, int], float]]:
    """method -> {(cohort, seed): value} for one split and metric."""
    out: dict[str, dict[tuple[str, int], float]] = defaultdict(dict)
    for row in rows:
        if row["split"] == split and row["metric"] == metric:
            out[row["method"]][(row["cohort"], row["seed"])] = row["value"]
    return out


# ----- statistics --------------------------------------------------------------------------
def mean_std(values: Sequence[float]) -> str:
    """'mean ± std' (sample std, ddof=1) over seeds; the bare value for one seed."""
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return MISSING
    if len(finite) == 1:
        return f"{finite[0]:.2f}"
    return f"{np.mean(finite):.2f} ± {sample_std(finite):.2f}"


def sample_std(values: Sequence[float]) -> float:
    """Sample standard deviation (ddof=1); 0 for a single value."""
    return float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


@dataclass(frozen=True)
class PairedTest:
    p: float
    test: str  # "Wilcoxon" or "t"
    n: int

    def __str__(self) -> str:
        return MISSING if math.isnan(self.p) else f"{self.p:.3g} ({self.test}, n={self.n})"


def paired_test(values: dict[Any, float], reference: dict[Any, float]) -> PairedTest:
    """Two-sided paired test on the keys both have (here (cohort, seed)): Wilcoxon signed-rank from
    WILCOXON_MIN_PAIRS pairs on, else a paired t-test; p is NaN with fewer than 2 pairs or when the
    test is undefined (e.g. identical values)."""
    from scipy import stats

    keys = sorted(k for k in values.keys() & reference.keys() if not (math.isnan(values[k]) or math.isnan(reference[k])))
    a, b = [values[k] for k in keys], [reference[k] for k in keys]
    if len(keys) < 2:
        return PairedTest(math.nan, "", len(keys))
    wilcoxon = len(keys) >= WILCOXON_MIN_PAIRS
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # degenerate differences: NaN, reported as such
        p = float((stats.wilcoxon(a, b) if wilcoxon else stats.ttest_rel(a, b)).pvalue)
    return PairedTest(p, "Wilcoxon" if wilcoxon else "t", len(keys))


def _seed_averages(by_key: dict[tuple[str, int], float]) -> list[float]:
    """Per seed, the mean over the sites: the 'Avg' of one run."""
    per_seed: dict[int, list[float]] = defaultdict(list)
    for (_, seed), value in by_key.items():
        per_seed[seed].append(value)
    return [nanmean(per_seed[s]) for s in sorted(per_seed)]


def _cohort_values(by_key: dict[tuple[str, int], float], cohort: str) -> list[float]:
    return [v for (c, _), v in sorted(by_key.items()) if c == cohort]


# ----- Markdown tables ---------------------------------------------------------------------
def _markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def ordered(cohorts: Iterable[str], known: Sequence[str] = ()) -> list[str]:
    """Cohorts in the task's site order (`known`, e.g. clients A-E), any others after, by name."""
    present = set(cohorts)
    return [c for c in known if c in present] + sorted(present - set(known))


def table_ii(
    rows: Sequence[dict[str, Any]], methods: Sequence[str], reference: str, metrics: Sequence[str], site_order: Sequence[str] = ()
) -> str:
    """Rows = methods; columns = each cohort's metrics at the best validation round, their average
    over the sites, and the paired test of the first metric against the reference."""
    values = {m: values_by_method(rows, "best_test", m) for m in metrics}
    cohorts = ordered((row["cohort"] for row in rows if row["split"] == "best_test"), site_order)
    first = metrics[0]
    header = ["method", "seeds"] + [f"{c} {label(m)}" for c in cohorts for m in metrics]
    header += [f"Avg {label(m)}" for m in metrics] + [f"Avg {label(first)}, last round", f"p ({label(first)} vs {reference})"]
    last = values_by_method(rows, "last_test", first)
    body = []
    for method in methods:
        seeds = len({seed for (_, seed) in values[first].get(method, {})})
        cells = [method, str(seeds)]
        cells += [mean_std(_cohort_values(values[m].get(method, {}), c)) for c in cohorts for m in metrics]
        cells += [mean_std(_seed_averages(values[m].get(method, {}))) for m in metrics]
        cells += [mean_std(_seed_averages(last.get(method, {})))]
        test = PairedTest(math.nan, "", 0)
        if method != reference and reference in values[first]:
            test = paired_test(values[first].get(method, {}), values[first][reference])
        body.append(cells + [str(test)])
    note = (
        f"Test {', '.join(label(m) for m in metrics)} (%) of each site's model at its best validation round; "
        "Avg = mean over the sites of one run; 'last round': the same average of the models after the run's last "
        "round, no selection. With several seeds: mean ± sample std (ddof=1) over seeds. "
        f"p: two-sided paired test of the per-(site, seed) test {label(first)} against {reference} "
        f"(Wilcoxon signed-rank when n ≥ {WILCOXON_MIN_PAIRS} pairs, else paired t-test 't'); "
        f"{MISSING} for the reference itself, fewer than 2 pairs, or an undefined test."
    )
    return _markdown(header, body) + "\n\n" + note


def ablation_table(rows: Sequence[dict[str, Any]], methods: Sequence[str], reference: str, metrics: Sequence[str]) -> str | None:
    """The paper's Table IV layout: the reference method and its variants (runs that set its options,
    `prr[det_enabled=false]`), best first by the first metric's average over the sites, each with its change
    against the reference over the seeds both ran and the paired test of Table II. None without variants."""
    variants = [m for m in methods if m.startswith(f"{reference}[")]
    if not variants:
        return None
    values = {m: values_by_method(rows, "best_test", m) for m in metrics}
    first = metrics[0]
    averages = {
        m: dict(zip(sorted({s for _, s in values[first].get(m, {})}), _seed_averages(values[first].get(m, {}))))
        for m in [reference, *variants]
    }
    ranked = sorted(averages, key=lambda m: -np.mean(list(averages[m].values())) if averages[m] else math.inf)
    body = []
    for method in ranked:
        seeds = sorted(averages[method].keys() & averages[reference].keys())
        change = [averages[method][s] - averages[reference][s] for s in seeds]
        cells = [method, str(len(averages[method]))] + [mean_std(_seed_averages(values[m].get(method, {}))) for m in metrics]
        if method == reference:
            cells += [MISSING, MISSING]
        else:
            cells += [
                mean_std(change) if change else MISSING,
                str(paired_test(values[first].get(method, {}), values[first].get(reference, {}))),
            ]
        body.append(cells)
    header = ["run", "seeds", *(f"Avg {label(m)}" for m in metrics), f"change of Avg {label(first)} vs {reference}", "p (Table II's test)"]
    note = (
        f"{reference} and its variants (the options in brackets differ from {reference}'s defaults), best first by Avg "
        f"{label(first)} (mean over the sites of one run; mean ± sample std over seeds). Change: the variant's Avg "
        f"{label(first)} minus {reference}'s, per seed both ran, mean ± sample std; negative = the component the "
        "variant turns off helped."
    )
    return _markdown(header, body) + "\n\n" + note


def table_x(rows: Sequence[dict[str, Any]], methods: Sequence[str], cohort: str, metrics: Sequence[str]) -> str:
    """The out-of-distribution cohort, scored by the best model of the site of `cohort`."""
    ood = [row for row in rows if row["split"] == "ood" and row["cohort"] == cohort]
    if not ood:
        return f"No out-of-distribution evaluation of site {cohort}'s model in these results."
    values = {m: values_by_method(ood, "ood", m) for m in metrics}
    body = []
    for method in methods:
        seeds = len(values[metrics[0]].get(method, {}))
        body.append([method, str(seeds)] + [mean_std(list(values[m].get(method, {}).values())) for m in metrics])
    header = ["method", "seeds"] + [f"OOD {label(m)}" for m in metrics]
    note = f"Best-on-validation model of site {cohort} on the out-of-distribution cohort; mean ± sample std over seeds."
    return _markdown(header, body) + "\n\n" + note


def minority_recall_table(
    results: Sequence[SiteResult], methods: Sequence[str], class_names: Sequence[str], reference: str | None = None
) -> str | None:
    """Each site's rarest training class (fewest images, at least one) and its test recall at the site's best
    validation round: at the most imbalanced site (the largest ratio of its commonest to its rarest class),
    and averaged over the sites; with a reference, the paired test of each (site, seed)'s recall against the
    reference's. None when the results hold no per-class recall."""
    counts = {r.cohort: r.class_counts for r in results if r.class_counts and len(r.class_counts) == len(class_names)}
    rarest = {c: min((n, k) for k, n in enumerate(cc) if n > 0)[1] for c, cc in counts.items() if any(cc)}
    tests = [(r, (r.best or {}).get("test") or {}) for r in results if r.cohort in rarest]
    if not rarest or not any(f"recall_{class_names[0]}" in t for _, t in tests):
        return None
    worst = max(rarest, key=lambda c: (max(counts[c]) / counts[c][rarest[c]], c))
    name = class_names[rarest[worst]]

    def recall(r: SiteResult, test: dict[str, float]) -> float:
        return test.get(f"recall_{class_names[rarest[r.cohort]]}", math.nan)

    by_key = {m: {(r.cohort, r.seed): recall(r, t) for r, t in tests if r.method == m} for m in methods}
    body = []
    for method in methods:
        own = by_key[method]
        at_worst = _cohort_values(own, worst)
        row = [method, str(len(at_worst)), mean_std(at_worst), mean_std(_seed_averages(own))]
        if reference is not None:
            row.append(MISSING if method == reference else str(paired_test(own, by_key.get(reference, {}))))
        body.append(row)
    header = ["method", "seeds", f"site {worst}: recall of {name}", "mean over sites of the rarest class's recall"]
    header += [f"p (vs {reference})"] if reference is not None else []
    cc = ", ".join(f"{n} {k}" for n, k in zip(counts[worst], class_names))
    note = (
        f"Site {worst} is the most imbalanced ({cc} training images); its rarest class is {name}. Test recall (%) of "
        "each site's model at its best validation round, mean ± sample std over seeds; the last column averages each "
        "site's recall of its own rarest training class first. A class imbalance method (CPA, FCA's prior) should raise it."
        + (
            " p: two-sided paired test of each (site, seed)'s rarest-class recall against the reference's (Table II's test)."
            if reference
            else ""
        )
    )
    return _markdown(header, body) + "\n\n" + note


def retrogress_summary(drops: Sequence[dict[str, Any]], methods: Sequence[str]) -> dict[str, tuple[float, float, int]]:
    """method -> (mean drop, sample std, number of (site, round, seed) drops)."""
    summary = {}
    for method in methods:
        values = [row["drop"] for row in drops if row["method"] == method]
        if values:
            summary[method] = (float(np.mean(values)), sample_std(values), len(values))
    return summary


def shared_drop_tests(shared_drops: Sequence[dict[str, Any]], methods: Sequence[str], reference: str) -> dict[str, PairedTest]:
    """method -> paired test of its shared model's drops against the reference's, pairing the drops of one
    (site, seed, round): did the download hurt the uploaded model more or less than the reference's?"""
    by_method: dict[str, dict[tuple[str, int, int], float]] = defaultdict(dict)
    for row in shared_drops:
        by_method[row["method"]][(row["cohort"], row["seed"], row["round"])] = row["drop"]
    ref = by_method.get(reference, {})
    return {m: paired_test(by_method[m], ref) for m in methods if m != reference and m in by_method}


def retrogress_table(
    summary: dict[str, tuple[float, float, int]],
    metric: str,
    shared: dict[str, tuple[float, float, int]] | None = None,
    shared_p: dict[str, PairedTest] | None = None,
    reference: str = "prr",
    models: dict[str, str] | None = None,
) -> str:
    """The reported models' drops (`summary`) and, beside them, the shared models' (`shared`, when any run
    recorded them) with their paired test against the reference's (`shared_p`): the drop that PFA is meant
    to soften is the shared model's."""
    if not summary:
        return "No per-epoch test records (eval_test_every_epoch) in these results: no retrogress measure."
    shared, shared_p = shared or {}, shared_p or {}

    def cells(stats: tuple[float, float, int] | None) -> list[str]:
        return [f"{stats[0]:.2f}", f"{stats[1]:.2f}", str(stats[2])] if stats else [MISSING] * 3

    def shared_cells(m: str) -> list[str]:
        return [*cells(shared.get(m)), str(shared_p[m]) if m in shared_p else MISSING]

    models = models or {}
    body = [[m, models.get(m, "the method's"), *cells(summary[m])] + (shared_cells(m) if shared else []) for m in summary]
    header = ["method", "model scored", f"mean {label(metric)} drop", "std", "n"]
    note = (
        f"Drop = test {label(metric)} after the last local epoch of round r-1 minus test {label(metric)} right "
        "after the download of round r (r ≥ 1), per site; mean and sample std over sites, rounds and seeds. "
        "Positive = the download made the evaluated model worse."
    )
    if shared:
        header += ["shared model's drop", "std", "n", f"p (vs {reference})"]
        note += (
            " The first columns are the model each site reports (PRR: the personalized model, which DET keeps); "
            "the shared model is the one a site uploads and the download overwrites (PRR: the deputy, which "
            "receives PFA's output, or with pfa_enabled=false the plain average; the reported model itself "
            f"for most methods), its test {label(metric)} as uploaded at the end of round r-1 minus right after the "
            f"download of round r. {MISSING}: runs that did not record it. p: two-sided paired test of the shared "
            f"model's drops against {reference}'s, one pair per (site, seed, round) both recorded (Table II's test)."
        )
    return _markdown(header, body) + "\n\n" + note


def runs_table(results: Sequence[SiteResult], methods: Sequence[str]) -> str:
    """Which runs the report is built from: provenance, and a check that every run finished."""
    runs: dict[tuple[str, int, str], list[SiteResult]] = defaultdict(list)
    for r in results:
        runs[(r.method, r.seed, r.run_id)].append(r)
    body = []
    for (method, seed, run_id), sites in sorted(runs.items(), key=lambda kv: (methods.index(kv[0][0]), kv[0][1])):
        rounds = sorted({s.rounds_completed for s in sites})
        sites_cell = ", ".join(f"{s.site} ({s.cohort})" for s in sites)
        body.append([method, _model_name(sites[0]), str(seed), run_id, sites_cell, "/".join(map(str, rounds))])
    return _markdown(["method", "model scored", "seed", "run id", "sites", "rounds completed"], body)


def _model_name(result: SiteResult) -> str:
    """The role a result scores, as the tables name it ("personal" for PRR's P); "the method's" when the run
    did not record it (runs written before results named their model)."""
    return result.reported_model or "the method's"


def _models_note(results: Sequence[SiteResult], methods: Sequence[str]) -> str:
    """A line naming the model behind each row of a method with several models (PRR: P and D)."""
    roles = {r.method: _model_name(r) for r in results}
    derived = [m for m in methods if "/" in m]
    if not derived:
        return ""
    parents = sorted({m.rsplit("/", 1)[0] for m in derived})
    rows = "; ".join(f"{p}: its reported model ({roles.get(p, '?')})" for p in parents)
    return (
        f"\nRows name the model they score: {rows}; <method>/<role>: the other model the same run trained and evaluated "
        "every round (PRR's deputy D), selected on validation by the same rule.\n"
    )


# ----- figures -----------------------------------------------------------------------------
Curve = tuple[np.ndarray, np.ndarray, np.ndarray]  # x (epochs done), mean and sample std over seeds


def site_curves(results: Sequence[SiteResult], metric: str) -> dict[str, Curve]:
    """cohort -> the site's per-epoch test curve (mean and std over seeds). The 'epoch' record of
    round r-1 and the 'download' record of round r share an x: sorted by round, the curve falls
    straight down by the retrogress at each communication."""
    points: dict[str, dict[tuple[int, int], list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        for h in r.history:
            if h["kind"] in ("epoch", "download"):
                points[r.cohort][(h["epochs_done"], h["round"])].append(h["test"][metric])
    curves = {}
    for cohort, by_x in points.items():
        keys = sorted(by_x)
        x = np.array([k[0] for k in keys], dtype=float)
        curves[cohort] = (x, np.array([np.mean(by_x[k]) for k in keys]), np.array([sample_std(by_x[k]) for k in keys]))
    return curves


def _communication_epochs(results: Sequence[SiteResult]) -> list[int]:
    return sorted({h["epochs_done"] for r in results for h in r.history if h["kind"] == "download"})


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers and CI
    import matplotlib.pyplot as plt

    return plt


def site_colours(cohorts: Iterable[str]) -> dict[str, Any]:
    """One fixed colour per cohort, the same in every figure."""
    plt = _pyplot()
    palette = plt.get_cmap("tab10").colors
    return {c: palette[i % len(palette)] for i, c in enumerate(sorted(cohorts))}


def plot_curves(method: str, results: Sequence[SiteResult], colours: dict[str, Any], path: Path, metric: str) -> Path:
    """Fig. 1 of the paper for one method: test metric of each site over the local epochs, the
    communication rounds marked; with several seeds the mean and a ±1 std band."""
    plt = _pyplot()
    seeds = len({r.seed for r in results})
    sites = {r.cohort: r.site for r in results}
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for epoch in _communication_epochs(results):
        ax.axvline(epoch, color="0.88", lw=0.8, zorder=0)
    for cohort, (x, mean, std) in sorted(site_curves(results, metric).items()):
        ax.plot(x, mean, color=colours[cohort], lw=1.6, label=f"{cohort} ({sites[cohort]})")
        if seeds > 1:
            ax.fill_between(x, mean - std, mean + std, color=colours[cohort], alpha=0.15, lw=0)
    ax.set_ylim(0, 100)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("local epochs done (grey lines: communication rounds)")
    ax.set_ylabel(f"test {label(metric)} (%)")
    spread = f"mean ± std of {seeds} seeds" if seeds > 1 else f"seed {results[0].seed}"
    ax.set_title(f"{method}: test {label(metric)} per site over training ({spread})")
    ax.legend(title="site", loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)  # never over a curve
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


EXAMPLES_FILE = "examples.npz"  # written by a segmentation site beside its results.json
OVERLAYS = "overlays.jpg"  # MRI slices: a JPEG


def plot_overlays(results: Sequence[SiteResult], methods: Sequence[str], path: Path, site_order: Sequence[str] = ()) -> Path | None:
    """Fig. 4 of the TMI paper: one test slice per site (columns) for each method (rows), the true
    contour in green and the method's predicted contour in red, from each run's examples file (the
    lowest seed of each method; the first example of each site, i.e. the largest prostate section of its
    first test volume). None when no run wrote examples."""
    chosen: dict[tuple[str, str], Any] = {}
    for r in sorted(results, key=lambda r: r.seed):
        file = r.path.parent / EXAMPLES_FILE
        if (r.method, r.cohort) not in chosen and file.is_file():
            with np.load(file) as z:
                chosen[(r.method, r.cohort)] = {k: z[k][0] for k in ("image", "truth", "prediction")}
    rows = [m for m in methods if any(k[0] == m for k in chosen)]
    cohorts = ordered((k[1] for k in chosen), site_order)
    if not rows:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(len(rows), len(cohorts), figsize=(2.2 * len(cohorts), 2.3 * len(rows)), squeeze=False)
    for i, method in enumerate(rows):
        for j, cohort in enumerate(cohorts):
            ax = axes[i][j]
            ax.set_xticks([])
            ax.set_yticks([])
            example = chosen.get((method, cohort))
            if example is not None:
                ax.imshow(example["image"], cmap="gray", vmin=0, vmax=255)
                for mask, colour in ((example["truth"], "lime"), (example["prediction"], "red")):
                    if mask.any():
                        ax.contour(mask, levels=[0.5], colors=colour, linewidths=1.0)
            if i == 0:
                ax.set_title(cohort, fontsize=10)
            if j == 0:
                ax.set_ylabel(method, fontsize=10)
    fig.suptitle("Test slices: ground truth (green) and prediction (red)", fontsize=10)
    return _save(fig, path, dpi=72)  # about 160 px a slice: the synthetic slices are 64-128 px


def plot_retrogress(
    summary: dict[str, tuple[float, float, int]],
    path: Path,
    reference: str,
    metric: str,
    shared: dict[str, tuple[float, float, int]] | None = None,
) -> Path:
    """Bar per method: mean drop of the test metric right after a communication round, ±1 std; with
    `shared`, a second bar beside it for the shared model (the one the download overwrites) where measured."""
    plt = _pyplot()
    methods = list(summary)
    shared = {m: v for m, v in (shared or {}).items() if m in summary}
    width = 0.4 if shared else 0.8
    x = np.arange(len(methods)) - (width / 2 if shared else 0.0)
    fig, ax = plt.subplots(figsize=(max(6.0, (1.6 if shared else 1.1) * len(methods) + 2), 4.8))
    colours = ["tab:green" if m == reference else "tab:blue" for m in methods]
    means, stds = [summary[m][0] for m in methods], [summary[m][1] for m in methods]
    ax.bar(x, means, width, yerr=stds, capsize=4, color=colours, alpha=0.85)
    labels = [f"{m}\n{mean:.1f} ± {std:.1f}" for m, mean, std in zip(methods, means, stds)]  # under the bars, clear of error bars
    if shared:
        at = [i for i, m in enumerate(methods) if m in shared]
        ax.bar(
            x[at] + width,
            [shared[methods[i]][0] for i in at],
            width,
            yerr=[shared[methods[i]][1] for i in at],
            capsize=4,
            color="tab:orange",
            alpha=0.85,
        )
        labels = [f"{lab}\nshared {shared[m][0]:.1f} ± {shared[m][1]:.1f}" if m in shared else lab for lab, m in zip(labels, methods)]
        from matplotlib.patches import Patch

        handles = [
            Patch(color="tab:blue", alpha=0.85, label=f"reported model ({reference}: green)"),
            Patch(color="tab:orange", alpha=0.85, label="shared model (uploaded, then overwritten)"),
        ]
        ax.legend(handles=handles, fontsize=8)
    ax.set_xticks(np.arange(len(methods)), labels, fontsize=8 if shared else None)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xlabel(f"method (green: the reference, {reference})")
    ax.set_ylabel(f"test {label(metric)} drop (points)")
    ax.set_title(
        f"Retrogress: test {label(metric)} lost right after a communication round\n(mean ± std over sites, rounds and seeds)", fontsize=11
    )
    ax.grid(axis="y", alpha=0.3)
    ax.margins(y=0.15)
    low, high = ax.get_ylim()
    ax.set_ylim(min(low, -1.0), max(high, 1.0))  # all-zero bars (PRR alone) read as 0 points, not as noise
    return _save(fig, path)


def _save(fig, path: Path, dpi: int = 90) -> Path:
    """The figure, written atomically and small enough to keep in git: a plot as a PNG of at most 256 colours
    (lossless for matplotlib's flat colours and lines), an image (.jpg: MRI slices) as a JPEG."""
    from PIL import Image

    fig.tight_layout()
    rendered = io.BytesIO()
    fig.savefig(rendered, format="png", dpi=dpi)
    _pyplot().close(fig)
    out = io.BytesIO()
    with Image.open(rendered) as image:
        if path.suffix == ".jpg":
            image.convert("RGB").save(out, format="jpeg", quality=85, optimize=True)
        else:
            image.convert("RGB").quantize(colors=256, dither=Image.Dither.NONE).save(out, format="png", optimize=True)
    return atomic_write_bytes(path, out.getvalue())


# ----- FCA's generalization / specialization protocol ----------------------------------------
PROTOCOL_LABELS = {"auc": "bAUC"}  # FCA's name: the mean one-vs-rest AUC over the classes present
GENERALIZATION_MODELS = {
    "global": "one global model (last round)",
    "sites": "each site's reported model (best round), mean over sites",
    "sites_last": "each site's model after the last round, mean over sites",
    None: "not evaluated (FLARE's cross-site evaluation: no pooled test split)",
}


def protocol_results(results: Sequence[SiteResult]) -> list[dict[str, Any]]:
    """Each run's crosseval.json (`prrfl.crosseval`, written by `prrfl sweep` and `prrfl crosseval`),
    computed here for a run that has none yet. A run that cannot be evaluated here (its models or data are
    not on this machine) is taken from the crosseval.json of FLARE's cross-site evaluation beside the server's
    results.json in the workspace (no generalization), else left out with a warning."""
    from prrfl.crosseval import write_crosseval

    found: dict[str, dict[str, Any] | None] = {}
    for r in results:
        if r.run_id in found:
            continue
        workspace = r.path.parents[3]  # <workspace>/<site>/prrfl/<run_name>/results.json
        wanted = workspace / "prrfl" / r.path.parent.name / CROSSEVAL_FILE
        path = existing_json(wanted)
        if path is None:
            try:
                write_crosseval(workspace)
                path = existing_json(wanted)
            except (OSError, ValueError, RuntimeError, KeyError) as e:
                deployed = [p for p in find_json(workspace, CROSSEVAL_FILE, recursive=True) if load_json(p).get("run_id") == r.run_id]
                if deployed:
                    path = deployed[0]
                else:
                    log.warning("run %s (%s): no generalization/specialization evaluation: %s", r.run_id, workspace, e)
        found[r.run_id] = None if path is None else {**load_json(path), "method": r.method}  # the run's label
    protocols = [p for p in found.values() if p is not None]
    for p in list(protocols):  # the other models a run scored (PRR's deputy), as rows of their own
        for role, part in (p.get("other_models") or {}).items():
            general = {"model": "sites_last", **part["generalization"]}
            protocols.append(
                {
                    **p,
                    "method": f"{p['method']}/{role}",
                    "reported_model": role,
                    "generalization": general,
                    "specialization": part["specialization"],
                    "cross_site": {},
                    "other_models": {},
                }
            )
    return protocols


def protocol_table(protocols: Sequence[dict[str, Any]], methods: Sequence[str], metrics: Sequence[str]) -> str:
    """FCA's Table 4 layout: per method, generalization and specialization, mean ± std over seeds."""
    names = [PROTOCOL_LABELS.get(m, label(m)) for m in metrics]
    header = ["method", "seeds", "generalization scored by"] + [f"Gen {n}" for n in names] + [f"Spec {n}" for n in names]
    body = []
    for method in methods:
        runs = [p for p in protocols if p["method"] == method]
        if not runs:
            continue
        scored_by = "; ".join(sorted({GENERALIZATION_MODELS[p["generalization"]["model"] if p["generalization"] else None] for p in runs}))
        cells = [method, str(len({p["seed"] for p in runs})), scored_by]
        for part in ("generalization", "specialization"):
            cells += [mean_std([p[part]["values"][m] for p in runs if p[part]]) for m in metrics]
        body.append(cells)
    note = (
        "FCA's protocol, in percent. Spec: each site's model at its best validation round on its own test split, "
        "mean over the sites. Gen: the test splits of all sites pooled, scored by the method's global model after "
        "the last round when it has one, else by each site's model (mean over the sites): two protocols, named "
        "in the third column. <method>/<role> rows: the other model of the run (PRR's deputy D), each site's after "
        "the last round, scored both ways. "
        + ("bAUC: the mean one-vs-rest AUC over the classes present (Table II's AUC). " if "auc" in metrics else "")
        + "With several seeds: mean ± sample std over seeds. The cross-site matrices are in each run's crosseval.json."
    )
    return _markdown(header, body) + "\n\n" + note


def cross_site_table(protocols: Sequence[dict[str, Any]], method: str, metric: str, site_order: Sequence[str] = ()) -> str:
    """One method's cross-site matrix: rows = the cohort whose best model scores, columns = the cohort
    whose test split it scores, `metric` mean ± std over seeds (the diagonal is Table II's value)."""
    cells: dict[tuple[str, str], list[float]] = defaultdict(list)
    for p in protocols:
        if p["method"] != method:
            continue
        cohorts = p["cohorts"]
        for model_site, row in p["cross_site"].items():
            for test_site, values in row.items():
                cells[(cohorts[model_site], cohorts[test_site])].append(values[metric])
    models = ordered({m for m, _ in cells}, site_order)
    tests = ordered({t for _, t in cells}, site_order)
    role = next((p.get("reported_model") for p in protocols if p["method"] == method and p.get("reported_model")), None)
    body = [[f"{m}'s {role or 'model'}"] + [mean_std(cells.get((m, t), [])) for t in tests] for m in models]
    return _markdown([f"{method}: {label(metric)} on →"] + tests, body)


# ----- the report --------------------------------------------------------------------------
def build_report(
    workspaces: Sequence[str | Path],
    out: str | Path,
    methods: Sequence[str] | None = None,
    reference: str = "prr",
    curves: Sequence[str] | None = None,
    task: str | None = None,
) -> Path:
    """Write results_long.csv, retrogress.csv, report.md, curves_<method>.png (for `curves`, default
    every method with per-epoch records) and retrogress.png into `out`; returns report.md's path.
    The results must be of one task (`task` picks one when the workspaces hold several)."""
    out = Path(out)
    results = find_results(workspaces, methods, task)
    if not results:
        what = f" of task '{task}'" if task else ""
        raise FileNotFoundError(f"no site results{what} ({RESULTS_GLOB}) under {', '.join(map(str, workspaces))}")
    tasks = sorted({r.task for r in results})
    if len(tasks) > 1:
        raise ValueError(f"the workspaces hold results of the tasks {tasks}: report one of them (--task)")
    facts = task_class(tasks[0])
    metrics = facts.table_metrics
    primary = facts.metric_names[0]  # what sites select their best round by
    order = method_order(results, methods, reference)
    rows = long_rows(results)
    drops = retrogress_rows(results, primary)
    shared_drops = retrogress_rows(results, primary, model="shared")
    write_csv(rows, LONG_FIELDS, out / "results_long.csv")
    write_csv(drops + shared_drops, RETROGRESS_FIELDS, out / "retrogress.csv")
    summary, shared_summary = retrogress_summary(drops, order), retrogress_summary(shared_drops, order)
    shared_p = shared_drop_tests(shared_drops, order, reference)
    figures = _figures(results, curves or order, summary, out, reference, primary, shared_summary)
    models = {r.method: _model_name(r) for r in results}
    overlays = plot_overlays(results, order, out / OVERLAYS, facts.site_names)  # segmentation runs write examples
    if overlays is None and (out / OVERLAYS).is_file():  # built earlier from the examples arrays kept results leave out
        overlays = out / OVERLAYS
    figures += [overlays] if overlays else []
    names = " and ".join([", ".join(label(m) for m in metrics[:-1]), label(metrics[-1])] if len(metrics) > 1 else [label(metrics[0])])
    sections = [
        f"# Results: {facts.name}\n",
        f"## Runs\n\n{runs_table(results, order)}\n",
        f"## {facts.paper_table}: per-site test {names}\n\n{table_ii(rows, order, reference, metrics, facts.site_names)}\n"
        + (f"\n{facts.table_note}\n" if facts.table_note else "")
        + _models_note(results, order),
    ]
    ablations = ablation_table(rows, order, reference, metrics)
    if ablations:
        sections.append(f"## Ablations (the paper's Table IV layout)\n\n{ablations}\n")
    if facts.ood_cohort and facts.ood_scored_by:
        table = table_x(rows, order, facts.ood_scored_by, metrics)
        sections.append(f"## Table X: out-of-distribution cohort, site {facts.ood_scored_by}'s model\n\n{table}\n")
    protocols = protocol_results(results)
    if protocols:
        table = protocol_table(protocols, order, facts.protocol_metrics)
        sections.append(f"## Generalization and specialization (FCA's protocol, its Table 4 layout)\n\n{table}\n")
        matrices = [
            cross_site_table(protocols, m, primary, facts.site_names)
            for m in order
            if any(p["method"] == m and p["cross_site"] for p in protocols)
        ]
        sections.append(
            f"## Cross-site matrix: test {label(primary)} of each site's best model on every site's test split\n\n"
            + "\n\n".join(matrices)
            + "\n\nMean ± sample std over seeds; the diagonal is each site's own test split (Table II).\n"
        )
    minority = minority_recall_table(results, order, facts.class_names, reference)  # None for tasks without per-class recall
    if minority:
        sections.append(f"## Class imbalance: the rarest class's recall\n\n{minority}\n")
    sections += [
        f"## Retrogress after communication\n\n{retrogress_table(summary, primary, shared_summary, shared_p, reference, models)}\n",
        "## Figures\n\n" + "\n".join(f"![{p.stem}]({p.name})" for p in figures) + "\n",
    ]
    return save_text("\n".join(sections), out / "report.md")


def _figures(
    results: Sequence[SiteResult],
    curves: Sequence[str],
    summary: dict[str, tuple[float, float, int]],
    out: Path,
    reference: str,
    metric: str,
    shared: dict[str, tuple[float, float, int]] | None = None,
) -> list[Path]:
    colours = site_colours({r.cohort for r in results})
    figures = []
    for method in curves:
        own = [r for r in results if r.method == method]
        if any(h["kind"] == "epoch" for r in own for h in r.history):
            figures.append(plot_curves(method, own, colours, out / f"curves_{re.sub(r'[^A-Za-z0-9_.-]+', '_', method)}.png", metric))
    if summary:
        figures.append(plot_retrogress(summary, out / "retrogress.png", reference, metric, shared))

    return figures
