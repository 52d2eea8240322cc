"""3D U-Net parts: sliding-window inference (constant models, windows batched or one by one, the
reference's crop-or-pad rule), Dice of perfect and empty predictions, the Dice + CE loss, the network's
shapes, and the v1.0 cadence in epochs rescaled to the samples per epoch."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from trainperf.contract import Cadence
from trainperf.errors import TrainperfError
from trainperf.workloads.unet3d import data as D
from trainperf.workloads.unet3d import inference as I
from trainperf.workloads.unet3d import model as M


@pytest.mark.parametrize("shape", [(20, 24, 17), (32, 32, 32), (70, 45, 33), (16, 80, 40)])
def test_a_constant_model_gives_that_constant_everywhere(shape):
    """Smaller than, equal to and larger than the 32^3 window: the Gaussian-weighted average of a
    constant is the constant, padding included."""
    volume = torch.randn(1, *shape)
    const = torch.tensor([0.25, -1.5, 3.0])

    def predict(w: torch.Tensor) -> torch.Tensor:
        return const[None, :, None, None, None].expand(w.shape[0], 3, *w.shape[2:])

    scores, bounds = I.sliding_window(volume, predict, roi=32, classes=3, batch=3)
    kept = tuple(stop - start for start, stop in bounds)
    assert scores.shape == (3, *kept)
    torch.testing.assert_close(scores, const[:, None, None, None].expand_as(scores), rtol=1e-6, atol=1e-6)
    for size, (start, stop) in zip(shape, bounds, strict=True):  # crop only remainders under 8 (stride/2)
        assert size - (stop - start) == (size % 16 if size % 16 < 8 else 0)


def test_batched_windows_equal_one_window_at_a_time_and_the_padding_is_seen():
    torch.manual_seed(0)
    net = torch.nn.Conv3d(1, 3, 3, padding=1)
    volume = torch.randn(1, 40, 37, 50)
    one, b1 = I.sliding_window(volume, net, roi=16, classes=3, batch=1)
    many, b2 = I.sliding_window(volume, net, roi=16, classes=3, batch=7)
    assert b1 == b2
    torch.testing.assert_close(one, many, rtol=1e-5, atol=1e-5)
    # a model that reports its input: the pad value shows up only where windows saw padding
    # (12^3 -> padded to 16^3 with -2.2; 9^3 -> its remainder of 1 cropped to 8^3, then padded)
    for size, kept in ((12, 12), (9, 8)):
        seen, _ = I.sliding_window(torch.full((1, size, size, size), 5.0), lambda w: w.repeat(1, 3, 1, 1, 1), roi=16,
                                   classes=3)
        assert seen.shape == (3, kept, kept, kept) and torch.allclose(seen, torch.full_like(seen, 5.0))
    padded, _ = I.sliding_window(torch.full((1, 12, 12, 12), 5.0), lambda w: w.mean((2, 3, 4), keepdim=True)
                                 .expand(-1, 3, *w.shape[2:]), roi=16, classes=3)
    assert float(padded.max()) < 5.0  # the window's mean includes the -2.2 padding


def test_gaussian_importance_is_the_references():
    g = I.gaussian_importance(128)
    assert g.shape == (128, 128, 128) and float(g.max()) == pytest.approx(1.0)
    sigma = 0.125 * 128
    # cube root of a product of three Gaussians: exp(-r^2 / (6 sigma^2)) away from the centre (63.5)
    expected = math.exp(-((64 - 63.5) ** 2 * 2 + (100 - 63.5) ** 2) / (2 * sigma ** 2) / 3)
    assert float(g[64, 64, 100]) / float(g[64, 64, 64]) == pytest.approx(
        expected / math.exp(-(3 * 0.5 ** 2) / (2 * sigma ** 2) / 3), rel=1e-6)


def test_dice_of_perfect_and_empty_predictions():
    label = torch.zeros(8, 8, 8, dtype=torch.long)
    label[2:5, 2:5, 2:5] = 1
    label[6:, 6:, 6:] = 2
    assert M.case_dice(label, label).tolist() == pytest.approx([1.0, 1.0])
    assert M.case_dice(torch.zeros_like(label), label).tolist() == pytest.approx([0.0, 0.0], abs=1e-6)
    only_kidney = label.clone()
    only_kidney[label == 2] = 0
    assert M.case_dice(only_kidney, only_kidney).tolist() == pytest.approx([1.0, 1.0])  # absent tumour: 1
    half = label.clone()
    half[2:5, 2:5, 2] = 0  # a third of the kidney missed: 2 * 18 / (18 + 27)
    assert M.case_dice(half, label)[0].item() == pytest.approx(36 / 45)


def test_dice_ce_loss_falls_for_the_right_answer():
    label = torch.zeros(1, 1, 8, 8, 8, dtype=torch.long)
    label[..., 2:6, 2:6, 2:6] = 1
    label[..., 7, 7, 6:] = 2
    good = torch.nn.functional.one_hot(label[:, 0], 3).movedim(-1, 1).float() * 20
    uniform = torch.zeros_like(good)
    assert M.dice_ce_loss(good, label) < 1e-3 < M.dice_ce_loss(uniform, label)
    # uniform softmax: Dice of class c = 2 (n_c / 3) / (512 / 3 + n_c); CE = log 3
    dice = [2 * n / 3 / (512 / 3 + n) for n in (64, 2)]
    assert M.dice_ce_loss(uniform, label).item() == pytest.approx((1 - sum(dice) / 2 + math.log(3)) / 2, rel=1e-4)


def test_network_shapes_and_halvings():
    net = M.UNet3D((4, 8, 16))
    assert net.halvings == 3
    out = net(torch.randn(2, 1, 16, 16, 16))
    assert out.shape == (2, 3, 16, 16, 16)
    reference = M.UNet3D()
    params = sum(p.numel() for p in reference.parameters())
    assert reference.halvings == 5 and params == 31_190_243  # 32/64/128/256/320, as the reference's


@pytest.mark.parametrize("samples,first,every,budget", [(168, 1000, 20, 10000), (84, 2000, 40, 20000),
                                                         (336, 500, 10, 5000), (100, 1680, 34, 16800),
                                                         (1000, 168, 4, 1680)])
def test_cadence_is_the_v1_rule_in_reference_epochs(samples, first, every, budget):
    """First evaluation at epoch ceil(1000 * 168 / S), then every ceil(20 * 168 / S); non-converged
    after ceil(10000 * 168 / S); S = samples per epoch."""
    cadence = Cadence(every=20, first=1000, max_epochs=10000, reference_epoch_samples=168).resolve(samples)
    assert (cadence.first, cadence.every, cadence.max_epochs) == (first, every, budget)
    assert first == math.ceil(1000 * 168 / samples) and every == math.ceil(20 * 168 / samples)


# ---------------------------------------------------------------------------------------------
# data: the preprocessed layout, bad input, patches, augmentation, NIfTI preprocessing
# ---------------------------------------------------------------------------------------------
def _write_case(root, case, shape=(1, 16, 16, 16), label_shape=None, classes=(0, 1, 2)):
    rng = np.random.default_rng(int(case))
    np.save(root / f"case_{case}_x.npy", rng.standard_normal(shape).astype(np.float32))
    np.save(root / f"case_{case}_y.npy", rng.choice(classes, label_shape or shape).astype(np.uint8))


def test_the_evaluation_split_and_checksums_are_the_references():
    assert len(D.EVAL_CASES) == 42 and len(set(D.EVAL_CASES)) == 42 and D.EVAL_CASES[-1] == "00207"
    sums = D.checksums()
    assert len(sums) == 420 and all(len(v) == 32 for v in sums.values())
    assert {k[5:10] for k in sums} == {f"{n:05d}" for n in range(210)}


def test_bad_cases_are_one_line_naming_the_case(tmp_path):
    for case in ("00001", "00002"):
        _write_case(tmp_path, case)
    cases = D.list_cases(tmp_path)
    assert list(cases) == ["00001", "00002"]
    train, evaluation = D.split(cases, ("00002",))
    assert train == ["00001"] and evaluation == ["00002"]
    with pytest.raises(TrainperfError, match="evaluation case 00003 has no files"):
        D.split(cases, ("00002", "00003"))
    _write_case(tmp_path, "00004", label_shape=(1, 16, 16, 15))
    with pytest.raises(TrainperfError, match=r"case 00004: image shape \(16, 16, 16\) and label shape \(16, 16, 15\)"):
        D.load_case("00004", *D.list_cases(tmp_path)["00004"])
    _write_case(tmp_path, "00005", classes=(0, 1, 3))
    with pytest.raises(TrainperfError, match=r"case 00005: label holds classes \[3\]"):
        D.load_case("00005", *D.list_cases(tmp_path)["00005"])
    (tmp_path / "case_00006_x.npy").write_bytes(b"not numpy")
    (tmp_path / "case_00006_y.npy").write_bytes(b"not numpy")
    with pytest.raises(TrainperfError, match="case 00006: case_00006_x.npy: not readable as .npy data"):
        D.load_case("00006", *D.list_cases(tmp_path)["00006"])
    # A header claiming 2 TiB: refused from the header and the file's size, nothing allocated (issue 60, 10).
    header = np.lib.format.header_data_from_array_1_0(np.zeros((1, 16, 16, 16), np.float32))
    header["shape"] = (1, 8192, 8192, 8192)
    with (tmp_path / "case_00006_x.npy").open("wb") as fh:
        np.lib.format.write_array_header_1_0(fh, header)
        fh.write(b"\0" * 64)
    with pytest.raises(TrainperfError, match=r"case_00006_x.npy: its .npy header says float32 \[1, 8192, 8192, 8192\] "
                                             r"\(2,199,023,255,552 bytes\), it holds 64 bytes"):
        D.load_case("00006", *D.list_cases(tmp_path)["00006"])
    (tmp_path / "case_00007_y.npy").write_bytes(b"")
    with pytest.raises(TrainperfError, match="case 00007 has no image"):
        D.list_cases(tmp_path)


def test_foreground_patches_hold_foreground():
    label = np.zeros((1, 64, 64, 64), np.uint8)
    label[0, 50:56, 5:9, 40:44] = 2  # a small tumour far from the centre
    label[0, 10:14, 10:14, 10:14] = 1
    label[0, 30, 30, 30] = 1  # a third, one-voxel kidney component: not among the two largest
    case = D.Case(np.zeros((1, 64, 64, 64), np.float32), label, D.foreground_boxes(label))
    assert sorted(case.boxes) == [1, 2] and len(case.boxes[1]) == 2 and len(case.boxes[2]) == 1
    rng = np.random.default_rng(0)
    for _ in range(50):
        image, patch = D.sample_patch(case, 16, 1.0, rng)
        assert image.shape == patch.shape == (1, 16, 16, 16) and patch.max() > 0
    hits = sum(D.sample_patch(case, 16, 0.0, rng)[1].max() > 0 for _ in range(200))
    assert hits < 60  # random patches mostly miss the small structures


def test_augmentation_flips_image_and_label_together():
    gen = torch.Generator().manual_seed(0)
    images = torch.arange(8 * 4 * 4 * 4, dtype=torch.float32).reshape(8, 1, 4, 4, 4)
    labels = images.clone().long()
    out, lab = D.augment(images, labels, gen)
    plain = (out - lab.float()).abs()  # no brightness or noise drawn: identical; else still a flipped copy
    flipped = [not torch.equal(lab[i], labels[i]) for i in range(8)]
    assert any(flipped) and not all(flipped)
    assert int((plain.flatten(1).max(1).values < 1e-6).sum()) >= 4


def _nifti(path, data, affine):
    nibabel = pytest.importorskip("nibabel")
    img = nibabel.Nifti1Image(data, affine)
    nibabel.save(img, str(path))


def test_nifti_preprocessing_on_a_tiny_case(tmp_path):
    case = tmp_path / "case_00010"
    case.mkdir()
    image = np.full((10, 20, 30), 101.0, np.float32)
    image[0] = 1000.0  # clipped to 304 -> (304 - 101) / 76.9
    label = np.zeros((10, 20, 30), np.uint8)
    label[4:6, 8:12, 10:20] = 1
    affine = np.diag([3.2, 2.4, 2.4, 1.0])
    _nifti(case / "imaging.nii.gz", image, affine)
    _nifti(case / "segmentation.nii.gz", label, affine)
    x, y = D.preprocess_case(case)
    assert x.shape == y.shape == (1, 128, 128, 128) and x.dtype == np.float32 and y.dtype == np.uint8
    # resampled to 20 x 40 x 60 (spacing halved), then edge-padded to 128 on every axis
    assert int((y > 0).sum()) == 4 * 8 * 20
    assert x.max() == pytest.approx((304 - 101) / 76.9) and float(np.median(x)) == pytest.approx(0.0)
    _nifti(case / "imaging.nii.gz", image, np.array([[2.0, 1.0, 0, 0], [0, 2.0, 0, 0], [0, 0, 2.0, 0], [0, 0, 0, 1]]))
    with pytest.raises(TrainperfError, match="case 00010: imaging.nii.gz has an oblique affine"):
        D.preprocess_case(case)
    _nifti(case / "imaging.nii.gz", image[:, :, :29], affine)
    with pytest.raises(TrainperfError, match="case 00010: imaging shape"):
        D.preprocess_case(case)


# ---------------------------------------------------------------------------------------------
# the workload: recipes and closed rules, preparation from NIfTI, the mini end to end
# ---------------------------------------------------------------------------------------------
def test_full_recipes_are_the_rcp_points_and_160_cases_are_refused(tmp_path):
    import json
    from pathlib import Path

    import mlperf_logging

    from tests.conftest import write_minimal_closed_log
    from trainperf.contract import RuntimeContext
    from trainperf.results.compliance import check
    from trainperf.workloads.unet3d import FULL_RECIPES, UNet3DWorkload

    rcps = json.loads((Path(mlperf_logging.__file__).parent / "rcp_checker" / "training_1.0.0"
                       / "rcps_unet3d.json").read_text())
    by_batch = {v["BS"]: v["Hyperparams"] for v in rcps.values()}
    workload = UNet3DWorkload()
    ctx = RuntimeContext.create("cpu")
    for recipe in FULL_RECIPES.values():
        # The RCP lists the warmup's starting rate; the reference's log does not carry it (nor trainperf's).
        hyper = {**workload.mlperf_hyperparameters(recipe, ctx), "opt_initial_learning_rate": recipe.init_lr}
        for key, value in by_batch[recipe.global_batch_size].items():
            assert hyper[key] == value, (recipe.name, key)
    log = tmp_path / "closed.txt"
    write_minimal_closed_log(log, "unet3d", 2, hyper, 0.91, 1000, train_samples=160, eval_samples=42)
    assert not check(log, "1.0.0").valid  # the rules fix 168 training cases
    assert workload.mlperf.runs == 40 and workload.mlperf.olympic_drop == 4


def test_lr_warmup_is_the_references():
    from trainperf.workloads.unet3d import FULL_RECIPES, lr_factor

    recipe = FULL_RECIPES["reference"]
    f = lr_factor(recipe, steps_per_epoch=84)
    assert f(1) * 0.8 == pytest.approx(1e-4 + (0.8 - 1e-4) / 200)  # epoch 1 of 200
    assert f(84) == f(1) and f(85) * 0.8 == pytest.approx(1e-4 + (0.8 - 1e-4) * 2 / 200)
    assert f(200 * 84) == pytest.approx(1.0) and f(10**6) == 1.0
    import dataclasses

    decayed = lr_factor(dataclasses.replace(recipe, warmup_epochs=0, decay_epochs=(3, 5), decay_factor=0.5), 10)
    assert [decayed(s) for s in (30, 31, 50, 51)] == [1.0, 0.5, 0.5, 0.25]


def test_prepare_from_raw_nifti_is_resumable_and_names_what_is_missing(tmp_path, capsys):
    from trainperf.cli import main

    root = tmp_path / "kits19"
    affine = np.diag([3.2, 2.4, 2.4, 1.0])
    for case in ("case_00000", "case_00001"):
        (root / case).mkdir(parents=True)
        image = np.full((8, 10, 12), 50.0, np.float32)
        label = np.zeros((8, 10, 12), np.uint8)
        label[3:5, 3:6, 4:8] = 1
        _nifti(root / case / "imaging.nii.gz", image, affine)
        _nifti(root / case / "segmentation.nii.gz", label, affine)
    code = main(["prepare", "unet3d", "--scale", "full", "--data", str(root)])
    said = capsys.readouterr()
    assert code != 0 and "evaluation case 00003 has no files" in said.out + said.err
    assert "Traceback" not in said.out + said.err
    x = np.load(root / "case_00001_x.npy")
    assert x.shape == (1, 128, 128, 128) and np.load(root / "case_00001_y.npy").dtype == np.uint8
    assert not list(root.glob(".*partial"))
    main(["prepare", "unet3d", "--scale", "full", "--data", str(root)])
    assert "2 already preprocessed" in capsys.readouterr().out


@pytest.mark.second_tier
def test_mini_runs_end_to_end_and_passes_the_checker(tmp_path):
    """Four epochs and the first sliding-window evaluation (the target itself: README, 10 seeds)."""
    from tests.conftest import cut_short_run, mini_data
    from trainperf.workloads.unet3d import MINI

    mini_data("unet3d")
    result = cut_short_run(["unet3d", "--seed", "0", "--device", "cpu", "--set", f"max_epochs={MINI.eval_first}"],
                           tmp_path / "run", "1.0.0")
    assert [e["epoch"] for e in result["evaluations"]] == [MINI.eval_first]
    assert 0.0 <= result["evaluations"][0]["value"] < MINI.target
    assert result["train_samples"] == 32 and result["eval_samples"] == 8


def test_non_finite_voxels_are_refused_naming_the_case(tmp_path, capsys):
    """A float volume with NaN outside its field of view (as nibabel's resampled test images have):
    the reference has no rule for it, and its clip lets NaN through to training; refuse in one line."""
    from trainperf.cli import main

    root = tmp_path / "kits19"
    (root / "case_00001").mkdir(parents=True)
    image = np.full((8, 10, 12), 50.0, np.float32)
    image[:, :3] = np.nan
    image[0, 5, 5] = np.inf
    affine = np.diag([3.2, 2.4, 2.4, 1.0])
    _nifti(root / "case_00001" / "imaging.nii.gz", image, affine)
    _nifti(root / "case_00001" / "segmentation.nii.gz", np.zeros((8, 10, 12), np.uint8), affine)
    assert main(["prepare", "unet3d", "--scale", "full", "--data", str(root)]) == 2
    said = capsys.readouterr()
    lines = [line for line in said.err.splitlines() if "error" in line]
    assert len(lines) == 1 and "Traceback" not in said.err, said.err
    assert "case 00001: imaging.nii.gz holds 289 non-finite voxels (NaN or infinite) of 960" in lines[0]
    assert not (root / "case_00001_x.npy").exists()
    # A prepared array damaged the same way is refused when training reads it.
    np.save(root / "case_00002_x.npy", np.full((1, 4, 4, 4), np.nan, np.float32))
    np.save(root / "case_00002_y.npy", np.zeros((1, 4, 4, 4), np.uint8))
    with pytest.raises(TrainperfError, match=r"^case 00002: case_00002_x.npy holds 64 non-finite voxels"):
        D.load_case("00002", root / "case_00002_x.npy", root / "case_00002_y.npy")


@pytest.mark.parametrize("shape, pixdim, message", [
    ((1, 1, 1), None, r"of \(1, 1, 1\) voxels at \(0.8, 0.7, 0.7\) mm resamples to \(0.5, 0.5833, 0.5833\)"),
    ((3, 4, 5), (float("nan"), 0.7, 0.7), r"has voxel spacing \(nan, 0.7, 0.7\) mm \(the header's pixdim\)"),
    # Terabytes: today torch refuses the size before allocating (a spacing asking for 2 TB, 1600 x 1200 x 1200
    # mm on 8^3 voxels, would try to allocate it: not in a test run on a machine that overcommits memory).
    ((3, 4, 5), (1e12, 1e12, 1e12), r"of \(3, 4, 5\) voxels at \(1e\+12, 1e\+12, 1e\+12\) mm resamples to \(1.875e"),
])
def test_spacing_and_resampled_size_are_checked_before_resampling(tmp_path, capsys, shape, pixdim, message):
    """The header's spacing decides the resampled size: a NaN, a volume that resamples to nothing, or a
    spacing that asks for terabytes is one line naming the case, not a RuntimeError from torch."""
    nibabel = pytest.importorskip("nibabel")
    from trainperf.cli import main

    root = tmp_path / "kits19"
    (root / "case_00001").mkdir(parents=True)
    for name, data in (("imaging.nii.gz", np.full(shape, 50.0, np.float32)),
                       ("segmentation.nii.gz", np.zeros(shape, np.uint8))):
        img = nibabel.Nifti1Image(data, np.diag([0.8, 0.7, 0.7, 1.0]))
        if pixdim is not None:
            img.header["pixdim"][1:4] = pixdim  # the spacing the reference reads (the affine stays sane)
        nibabel.save(img, str(root / "case_00001" / name))
    with pytest.raises(TrainperfError, match=r"^case 00001: imaging.nii.gz " + message):
        D.preprocess_case(root / "case_00001")
    assert main(["prepare", "unet3d", "--scale", "full", "--data", str(root)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("value", ["", ",", "abc", "3,x"])
def test_eval_cases_must_name_at_least_one_case_number(value):
    """`--set eval_cases=` left no evaluation case (the run trained, then failed at its first evaluation);
    `eval_cases=abc` raised ValueError (exit 3) when the data was checked."""
    from trainperf.workloads.unet3d import FULL_RECIPES

    with pytest.raises(TrainperfError, match="recipe field eval_cases="):
        FULL_RECIPES["reference"].with_overrides([f"eval_cases={value}"])
