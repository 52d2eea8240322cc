"""What the Criteo click-through workloads (dlrm, dlrm_dcnv2) share: the MLP shapes their interaction needs,
the evaluation's click probabilities (their AUC and the batch reader: common/ranking.py)."""
