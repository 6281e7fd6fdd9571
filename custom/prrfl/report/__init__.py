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

The package, by concern: `runs` (finding and reading results files), `stats` (tidy rows, statistics),
`tables` (Markdown), `figures`, `protocol` (FCA's generalization/specialization) and `build` (the report).
"""

from prrfl.report.build import build_report
from prrfl.report.figures import plot_curves, plot_overlays, plot_retrogress
from prrfl.report.listing import RESULTS_FILE, RunResults, find_runs, results_kind, server_run
from prrfl.report.protocol import cross_site_table, protocol_results, protocol_table
from prrfl.report.runs import RESULTS_GLOB, SiteResult, find_results, method_order, variant_label
from prrfl.report.stats import (
    LONG_FIELDS,
    RETROGRESS_FIELDS,
    PairedTest,
    long_rows,
    mean_std,
    paired_test,
    retrogress_rows,
    sample_std,
    values_by_method,
    write_csv,
)
from prrfl.report.tables import (
    ablation_table,
    minority_recall_table,
    retrogress_summary,
    retrogress_table,
    runs_table,
    shared_drop_tests,
    table_ii,
    table_x,
)

__all__ = [
    "RESULTS_FILE",
    "RESULTS_GLOB",
    "RunResults",
    "SiteResult",
    "find_results",
    "find_runs",
    "method_order",
    "results_kind",
    "server_run",
    "variant_label",
    "LONG_FIELDS",
    "RETROGRESS_FIELDS",
    "PairedTest",
    "long_rows",
    "mean_std",
    "paired_test",
    "retrogress_rows",
    "sample_std",
    "values_by_method",
    "write_csv",
    "ablation_table",
    "minority_recall_table",
    "retrogress_summary",
    "retrogress_table",
    "runs_table",
    "shared_drop_tests",
    "table_ii",
    "table_x",
    "plot_curves",
    "plot_overlays",
    "plot_retrogress",
    "cross_site_table",
    "protocol_results",
    "protocol_table",
    "build_report",
]
