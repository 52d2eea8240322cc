"""The workload contract and the typed records the harness, runtime and results share.

A workload *declares* what it is (name, MLPerf key, ruleset, metric, recipes, evaluation cadence) and
*returns* the parts the harness needs (model, optimizer, loss, LR schedule, evaluation forward, data,
evaluation). It never starts a clock, writes a log or touches the process group: the harness owns
those, and hands the workload a `RuntimeContext` (device, rank, seed) instead of global state.

What the contract can express, and which MLPerf workload needs it:
- quality as one value or as named values with a target each (Mask R-CNN: BBOX and SEGM AP);
- evaluation outputs as tensor sums, tensor gathers, or Python objects gathered to rank 0
  (detections, decoded strings), scored on rank 0, the verdict shared with every rank;
- a cadence every k epochs from s, at listed epochs (SSD), k times per epoch (DLRM), every N samples
  (BERT), or in epochs of a reference size rescaled to the data (3D U-Net); a budget in epochs or
  samples;
- training data the model produces (MiniGo self-play), of unknown length, and rule-required events
  logged from inside the timed region;
- batches that are not dim-0 tensors (lists of images) and losses normalised by tokens;
- gradient clipping, an after-step hook, a separate evaluation model (EMA weights);
- an evaluation forward (decoding, sliding windows) compiled and warmed up before run_start;
- batches padded to a few fixed shapes (length buckets) for compiled graphs and CUDA Graphs.

The contract lives in one package, a file per idea; everything is importable from `trainperf.contract`:
quality.py (Metric), cadence.py (Cadence), recipe.py (Recipe), context.py (RuntimeContext),
fields.py (a recipe field's interval), batches.py (splitting and counting batches), assets.py (Assets),
parts.py (ModelParts, DataParts, EvalPartial, EpochView, Logged), scale.py (Scale, DataSource),
mlperf.py (MLPerf), golden.py (GoldenSpec), buckets.py (LengthBuckets), parallel.py (Parallelism),
workload.py (Workload), results.py (Evaluation, RunResult).
"""

from trainperf.contract.assets import Assets
from trainperf.contract.batches import count_samples, per_epoch_schedule, split_batch
from trainperf.contract.buckets import LengthBuckets
from trainperf.contract.cadence import Cadence
from trainperf.contract.context import RuntimeContext, bare_model, batch_share, uncompiled
from trainperf.contract.fields import Count, Counts, Fraction, Positive, Share
from trainperf.contract.golden import GoldenSpec
from trainperf.contract.mlperf import MLPerf
from trainperf.contract.parallel import DataParallel, FullyShard, Parallelism, ShardedTables
from trainperf.contract.parts import DataParts, EpochView, EvalPartial, Logged, ModelParts
from trainperf.contract.probes import DeviceProbe, StepBudget, StepProbe
from trainperf.contract.quality import EPOCH_NUM_STYLES, SCALES, Metric, Quality, Target
from trainperf.contract.recipe import R, Recipe
from trainperf.contract.results import Evaluation, RunResult
from trainperf.contract.scale import DataSource, Scale
from trainperf.contract.sharded import ExpertLayer, ShardedModel
from trainperf.contract.workload import Workload

__all__ = [
    "EPOCH_NUM_STYLES", "R", "SCALES", "Assets", "Cadence", "Count", "Counts", "DataParallel", "DataParts",
    "DataSource", "DeviceProbe", "EpochView", "EvalPartial", "Evaluation", "ExpertLayer", "Fraction", "FullyShard",
    "GoldenSpec", "LengthBuckets", "Logged", "MLPerf", "Metric", "ModelParts", "Parallelism", "Positive", "Quality",
    "Recipe", "RunResult", "RuntimeContext", "Scale", "ShardedModel", "ShardedTables", "Share", "StepBudget",
    "StepProbe", "Target", "Workload", "bare_model", "batch_share", "count_samples", "per_epoch_schedule",
    "split_batch", "uncompiled",
]
