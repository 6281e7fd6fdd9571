"""prr-flare as a FLARE 2.9 job script: build the recipe of a (task, method) job, pick an environment, execute.

    python job.py                                         # derm_prr on 4 simulated sites (SimEnv)
    python job.py --task prostate --method fedbn          # any task and method
    python job.py --set num_rounds=2 --set data.image_size=32   # config fields, as `prrfl run --set`
    python job.py --env poc --sites 2                     # a proof-of-concept deployment on this machine (PocEnv)
    python job.py --env prod --startup-kit <admin kit>    # a provisioned deployment (ProdEnv)
    python job.py --export --export-dir jobs_out          # FLARE's own flags: write the job folder, run nothing

`prrfl run` is the same with every option of the job (--resume, --privacy, ...).
"""

import argparse

from prrfl.cli import apply_overrides
from prrfl.flare.job_recipe import PersonalizedRecipe, environment, result_tables
from prrfl.registry import task_class


def build_recipe(argv: list[str] | None = None) -> tuple[PersonalizedRecipe, argparse.Namespace, int]:
    """The recipe of the command line `argv` (default: sys.argv), its parsed arguments and its number of sites."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="derm")
    parser.add_argument("--method", default="prr")
    parser.add_argument("--env", choices=["sim", "poc", "prod"], default="sim")
    parser.add_argument("--sites", type=int, help="default: the task's number of sites")
    parser.add_argument("--workspace", default="workspace", help="sim: runs in <workspace>/<task>_<method>")
    parser.add_argument("--startup-kit", help="prod: the admin's startup kit folder")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field (dotted keys: data.image_size=128)"
    )
    args = parser.parse_args(argv)

    sites = args.sites or len(task_class(args.task).site_names)
    return PersonalizedRecipe(task=args.task, method=args.method, overrides=apply_overrides({}, args.set), min_clients=sites), args, sites


def main() -> None:
    recipe, args, sites = build_recipe()
    env = environment(args.env, sites, workspace=args.workspace, startup_kit=args.startup_kit)
    run = recipe.execute(env)
    result = run.get_result(clean_up=False)  # keep a POC workspace: it holds the result
    # the last lines, as `prrfl run` ends: the per-site table and the cross-site matrix
    print(
        f"job {run.get_job_id()} ({recipe.name}) on {args.env}: {run.get_status() or 'done'}; results in {result}\n\n{result_tables(result)}"
    )


if __name__ == "__main__":
    main()
