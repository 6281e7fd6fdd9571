"""Every key that travels in a message's meta, in one table (no FLARE import: the server cores, the sites and
the FLARE components all read it from here).

Task names and the workflow's own keys (prrfl's jobs):
"""

from __future__ import annotations

TASK_PREPARE = "prepare"  # sites load (or generate) their data and report class counts
TASK_TRAIN = "train"
# after the last round, to a method that reports its global model (Method.reports_download): each site scores the
# last round's aggregate as it scored every earlier one, without training
TASK_SCORE = "score"

# the workflow -> every site, in each task's meta
CONFIG = "prrfl_config"
RUN_ID = "run_id"
ROUND = "round"
NUM_SITES = "num_sites"
# a site -> the workflow, when it could not do its task: the reason, naming the file
ERROR = "error"

# a client's result: its training-set size, or FLARE's count of local steps (either weights the average)
NUM_SAMPLES = "num_samples"
NUM_STEPS = "NUM_STEPS_CURRENT_ROUND"  # nvflare's MetaKey.NUM_STEPS_CURRENT_ROUND, as FLARE's FedAvg reads it

# Progressive Fourier Aggregation: the round's box half-width r, in every output model's meta
PFA_R = "pfa_r"

# class statistics (PRR's CPA, FedProto): client -> server, in a result's meta
PROTOTYPES = "prototypes"  # [C][D] mean embedding of each class over the last local epoch
PROTOTYPE_PRESENT = "prototype_present"  # [C] whether the class had samples
CLASS_COUNTS = "class_counts"  # [C] the training split's class counts
# server -> client, in the meta of its next model
GLOBAL_PROTOTYPES = "global_prototypes"
GLOBAL_PROTOTYPE_PRESENT = "global_prototype_present"
GLOBAL_CLASS_COUNTS = "global_class_counts"

# CReFF's class gradients: client -> server, in a result's meta
CLASS_GRADIENTS = "class_gradients"  # [C][P] each class's cross-entropy gradient w.r.t. the classifier's P parameters
CLASS_GRADIENT_PRESENT = "class_gradient_present"  # [C] whether the site holds the class (its row is zero otherwise)
GRADIENT_CLASSIFIER_ROUND = "gradient_classifier_round"  # the round whose re-trained classifier they were taken at (-1: round 0's)
# server -> client, in the meta of its next model
RETRAINED_CLASSIFIER = "retrained_classifier"  # [P] the classifier re-trained on the federated features
RETRAINED_ROUND = "retrained_round"  # the round it was re-trained in
MATCH_LOSS = "match_loss"  # [2] the gradient-matching loss before and after the features' steps
