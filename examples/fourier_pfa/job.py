"""The example's FLARE job: PersonalizedFedAvg with a Fourier, FedAvg or FedBN aggregator, and the
Client API script client.py at every site.

    python job.py --aggregator fourier --rounds 5 --sites 2        # runs it in FLARE's simulator
    python prepare_data.py --out /tmp/nvflare/fourier_pfa/data     # the same images, written as ImageFolders,
    python job.py --data_root /tmp/nvflare/fourier_pfa/data        # read from there
    python job.py --aggregator fourier --export /tmp/nvflare/jobs  # writes the job folder instead
"""

import argparse
import os
from pathlib import Path

from model import Net
from nvflare.client.config import ExchangeFormat, TransferType
from nvflare.job_config.api import FedJob
from nvflare.job_config.script_runner import ScriptRunner

from prrfl.flare.components import FedAvgAggregator, FedBNAggregator, FourierAggregator, PersonalizedFedAvg, PrototypeExchange

HERE = Path(__file__).resolve().parent
AGGREGATORS = {
    "fourier": FourierAggregator,  # PFA: low frequencies shared, high frequencies personal, BN local
    "fedavg": FedAvgAggregator,  # the same average for every site
    "fedbn": FedBNAggregator,  # the average, BatchNorm kept at each site
}


def build_job(aggregator: str, rounds: int, sites: int, data_root: str | None = None, epochs: int = 2) -> FedJob:
    job = FedJob(name=f"fourier_pfa_{aggregator}", min_clients=sites)
    job.set_app_packages(["prrfl"])  # imported from the installation, not copied into the job
    controller = PersonalizedFedAvg(
        num_rounds=rounds,
        aggregator=AGGREGATORS[aggregator](),
        model=Net(),
        min_clients=sites,
        prototypes=PrototypeExchange(seed=0),
    )
    job.to_server(controller)
    runner = ScriptRunner(
        script="client.py",
        script_args=(f"--data_root {Path(data_root).resolve()} " if data_root else "") + f"--epochs {epochs}",
        params_transfer_type=TransferType.DIFF,  # the site sends its update; the server adds it to what it sent
        server_expected_format=ExchangeFormat.PYTORCH,  # the server works on torch tensors
    )
    job.to_clients(runner)
    return job


def main():
    parser = argparse.ArgumentParser(description="personalized FL with Fourier aggregation on FLARE")
    parser.add_argument("--aggregator", choices=sorted(AGGREGATORS), default="fourier")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sites", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2, help="local epochs per round (DET starts each round in Recover: use 2 or more)")
    parser.add_argument("--data_root", default=None, help="what prepare_data.py wrote (default: each site makes its images in memory)")
    parser.add_argument("--workspace", default="/tmp/nvflare/fourier_pfa/workspace", help="the simulator's workspace")
    parser.add_argument("--export", metavar="DIR", help="write the job folder to DIR instead of running it")
    args = parser.parse_args()
    workspace, export = Path(args.workspace).resolve(), args.export and Path(args.export).resolve()

    os.chdir(HERE)  # FLARE's ScriptRunner takes client.py from the current folder
    job = build_job(args.aggregator, args.rounds, args.sites, args.data_root, args.epochs)
    if export:
        job.export_job(str(export))
        print(f"job written to {export / job.name}")
    else:
        job.simulator_run(str(workspace), n_clients=args.sites)


if __name__ == "__main__":
    main()
