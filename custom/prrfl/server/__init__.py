"""The server's side of a run, without FLARE: aggregation (`aggregation`: FedAvg, FedBN, Progressive Fourier
Aggregation), the checks an upload passes before it is used (`checks`), the class-statistics exchange
(`class_statistics`) and a round of a prrfl run as pure functions over typed state (`federation`). prrfl's methods
call these directly; the FLARE components (prrfl.flare.components) and prrfl's FLARE workflow are adapters
over them."""
