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

The contract lives in one package, a file per idea; everything is importable from `trainperf.spec`:
quality.py (Metric), cadence.py (Cadence), recipe.py (Recipe), context.py (RuntimeContext),
fields.py (a recipe field's interval), batches.py (splitting and counting batches), assets.py (Assets),
parts.py (ModelParts, DataParts, EvalPartial, EpochView, Logged), scale.py (Scale, DataSource),
mlperf.py (MLPerf), golden.py (GoldenSpec), buckets.py (LengthBuckets), parallel.py (Parallelism),
workload.py (Workload), results.py (Evaluation, RunResult).
"""

from trainperf.spec.assets import Assets
from trainperf.spec.batches import count_samples, per_epoch_schedule, split_batch
from trainperf.spec.buckets import LengthBuckets
from trainperf.spec.cadence import Cadence
from trainperf.spec.context import RuntimeContext, bare_model, uncompiled
from trainperf.spec.fields import Count, Counts, Fraction, Positive, Share
from trainperf.spec.golden import GoldenSpec
from trainperf.spec.mlperf import MLPerf
from trainperf.spec.parallel import DataParallel, FullyShard, Parallelism, ShardedTables
from trainperf.spec.parts import DataParts, EpochView, EvalPartial, Logged, ModelParts
from trainperf.spec.quality import EPOCH_NUM_STYLES, SCALES, Metric, Quality, Target
from trainperf.spec.recipe import R, Recipe
from trainperf.spec.results import Evaluation, RunResult
from trainperf.spec.scale import DataSource, Scale
from trainperf.spec.workload import Workload

__all__ = [
    "EPOCH_NUM_STYLES", "R", "SCALES", "Assets", "Cadence", "Count", "Counts", "DataParallel", "DataParts",
    "DataSource", "EpochView", "EvalPartial", "Evaluation", "Fraction", "FullyShard", "GoldenSpec", "LengthBuckets",
    "Logged",
    "MLPerf", "Metric", "ModelParts", "Parallelism", "Positive", "Quality", "Recipe", "RunResult", "RuntimeContext",
    "Scale", "ShardedTables", "Share", "Target", "Workload", "bare_model", "count_samples", "per_epoch_schedule",
    "split_batch", "uncompiled",
]
