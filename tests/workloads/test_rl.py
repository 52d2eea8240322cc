"""The RL loop's shared parts: the sandbox that turns code into a reward (contained whatever the code
does), and GRPO's arithmetic held to a line-by-line re-statement of the v6.1 reference's (NeMo-RL 3fca04c9)."""

from __future__ import annotations

import math
import os
import socket
import threading
import time
from pathlib import Path

import pytest
import torch

from trainperf.errors import TrainperfError
from trainperf.workloads.common.llm.model import Llama, LlamaConfig
from trainperf.workloads.common.llm.moe import MoEConfig
from trainperf.workloads.common.llm.qwen35 import Qwen35, Qwen35Config
from trainperf.workloads.common.rl import engine as engine_mod
from trainperf.workloads.common.rl import grpo, jail, loop, sandbox
from trainperf.workloads.common.rl.engine import RolloutEngine, Sampling, TorchEngine

landlock = pytest.mark.skipif(jail.landlock_abi() < 1 or os.uname().machine not in ("x86_64", "aarch64"),
                              reason="the sandbox needs Linux Landlock and an x86_64/aarch64 seccomp filter")


def _run(code: str, **limits: float) -> sandbox.Outcome:
    return sandbox.run({"main.py": code}, ["python", "main.py"], sandbox.Limits(**limits))


def _alive(marker: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(int(pid))
            except OSError:
                continue
    return found


@landlock
def test_a_program_that_passes_passes_and_its_output_comes_back() -> None:
    out = sandbox.run({"main.py": "import helper\nprint(helper.VALUE)\nopen('made.txt', 'w').write('ok')\n",
                       "helper.py": "VALUE = 41 + 1\n"}, ["python", "main.py"])
    assert out.passed and out.stdout == "42\n"
    failed = _run("raise SystemExit(3)")
    assert failed.status == "failed" and failed.returncode == 3 and not failed.passed


@landlock
def test_writing_or_reading_outside_the_scratch_folder_is_denied(tmp_path: Path) -> None:
    secret, target = tmp_path / "secret.txt", tmp_path / "written.txt"
    secret.write_text("user data")
    out = _run(f"open({str(target)!r}, 'w').write('x')")
    assert not out.passed and "PermissionError" in out.stderr and not target.exists()
    out = _run(f"print(open({str(secret)!r}).read())")
    assert not out.passed and "user data" not in out.stdout
    out = _run("import os\nos.remove(os.path.expanduser('~/../../') + 'etc/hostname')")
    assert not out.passed and Path("/etc/hostname").exists() == os.path.exists("/etc/hostname")


@landlock
def test_a_fork_bomb_is_contained_and_nothing_survives() -> None:
    marker = f"bomb{os.getpid()}x{time.monotonic_ns()}"
    code = (f"# {marker}\nimport os, subprocess\ntry:\n    subprocess.Popen(['sleep', '100'])\n"
            "except OSError:\n    pass\nwhile True:\n    os.fork()\n")
    out = sandbox.run({"main.py": code}, ["python", "main.py", marker])
    assert not out.passed and "PermissionError" in out.stderr
    assert _alive(marker) == []


@landlock
def test_allocating_without_limit_fails_within_the_memory_limit() -> None:
    out = _run("blocks = []\nwhile True:\n    blocks.append(bytearray(64 << 20))", memory_bytes=256 << 20)
    assert not out.passed and ("MemoryError" in out.stderr or out.status == "killed")


@landlock
def test_no_socket_no_connection() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.settimeout(0.5)
        port = server.getsockname()[1]
        out = _run(f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\ns.send(b'hi')")
        assert not out.passed and "PermissionError" in out.stderr
        with pytest.raises(TimeoutError):
            server.accept()


@landlock
def test_sleeping_forever_is_killed_at_the_wall_limit_and_leaves_nothing() -> None:
    marker = f"sleeper{os.getpid()}x{time.monotonic_ns()}"
    out = sandbox.run({"main.py": "import time\ntime.sleep(1000)"}, ["python", "main.py", marker],
                      sandbox.Limits(wall_s=0.5))
    assert out.status == "timeout" and not out.passed and out.seconds < 5
    assert _alive(marker) == []


@landlock
def test_the_cpu_limit_stops_a_busy_loop() -> None:
    out = _run("while True:\n    pass", cpu_s=1, wall_s=20)
    assert out.status == "killed" and out.seconds < 10


@landlock
def test_signalling_the_parent_is_denied_and_threads_are_allowed() -> None:
    out = _run("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)")
    assert not out.passed and "PermissionError" in out.stderr
    out = _run("import threading\nt = threading.Thread(target=print, args=('from a thread',))\nt.start()\nt.join()")
    assert out.passed and out.stdout == "from a thread\n"


@landlock
def test_filling_the_scratch_folder_is_stopped() -> None:
    code = "i = 0\nwhile True:\n    open(f'f{i}', 'wb').write(b'x' * (1 << 20))\n    i += 1"
    out = _run(code, scratch_bytes=4 << 20, wall_s=20)
    assert out.status in ("scratch", "failed", "killed") and not out.passed and out.seconds < 10
    big = _run("open('big', 'wb').write(b'x' * (4 << 20))", file_bytes=1 << 20)
    assert not big.passed


@landlock
def test_output_is_cut_at_its_limit() -> None:
    out = _run("print('y' * 100000)", output_bytes=1000)
    assert out.passed and len(out.stdout) < 1100 and out.stdout.endswith("[... output cut]")


def test_a_file_name_that_leaves_the_scratch_folder_is_refused() -> None:
    with pytest.raises(TrainperfError, match="leaves the scratch folder"):
        sandbox.run({"../escape.py": "x"}, ["python", "escape.py"])


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_seccomp_filter_jumps_stay_inside_the_program(machine: str) -> None:
    prog = jail.seccomp_program(machine, 1234)
    assert len(prog) < 4096 and prog[-1] == (0x06, 0, 0, 0x7FFF0000)
    for i, (code, jt, jf, _k) in enumerate(prog):
        if code & 0x07 == 0x05:  # a jump
            assert i + 1 + max(jt, jf) < len(prog)
    assert prog[1][3] == {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}[machine]


def test_container_runtime_is_named_or_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    with pytest.raises(TrainperfError, match="apptainer") as err:
        sandbox.container_runtime()
    assert "\n" not in str(err.value)


def _reference_baseline_and_std(prompts: torch.Tensor, rewards: torch.Tensor, valid: torch.Tensor,
                                leave_one_out: bool) -> tuple[torch.Tensor, torch.Tensor]:
    # NeMo-RL 3fca04c9 nemo_rl/algorithms/utils.py::calculate_baseline_and_std_per_prompt, re-stated
    baseline, std = torch.zeros_like(rewards), torch.zeros_like(rewards)
    for prompt in torch.unique(prompts, dim=0):
        idx = torch.arange(len(prompts))[(prompts == prompt).all(1)]
        matrix = (1 - torch.eye(len(idx), dtype=rewards.dtype)) if leave_one_out else torch.ones(
            len(idx), len(idx), dtype=rewards.dtype)
        if valid[idx].sum() <= 1:
            baseline[idx] = rewards[idx]
            continue
        n = valid[idx].float().sum() - int(leave_one_out)
        b = matrix @ (rewards[idx] * valid[idx]) / n
        sq = matrix @ (rewards[idx].pow(2) * valid[idx]) / n
        baseline[idx] = b
        std[idx] = ((sq - b.square()) * (n / (n - 1))).sqrt().nan_to_num(0)
    return baseline, std


def _reference_advantages(prompts: torch.Tensor, rewards: torch.Tensor, leave_one_out: bool) -> torch.Tensor:
    # advantage_estimator.py::GRPOAdvantageEstimator.compute_advantage with normalize_rewards
    baseline, std = _reference_baseline_and_std(prompts, rewards, torch.ones_like(rewards), leave_one_out)
    adv = (rewards - baseline).unsqueeze(-1)
    nz = std > 0
    adv[nz] = adv[nz] / (std.unsqueeze(-1)[nz] + 1e-6)
    return adv.squeeze(-1)


@pytest.mark.parametrize("leave_one_out", [True, False])
@pytest.mark.parametrize("kind", ["binary", "real"])
def test_group_advantages_equal_the_reference(leave_one_out: bool, kind: str) -> None:
    gen = torch.Generator().manual_seed(3)
    groups, g = 12, 16
    rewards = (torch.rand(groups * g, generator=gen) < torch.rand(groups, generator=gen).repeat_interleave(g)).float() \
        if kind == "binary" else torch.randn(groups * g, generator=gen, dtype=torch.float64)
    rewards[:g] = 1.0  # a group with no variation: no division
    rewards[g:2 * g] = 0.0
    prompts = torch.arange(groups).repeat_interleave(g).unsqueeze(1)
    ours = grpo.group_advantages(rewards, g, leave_one_out=leave_one_out)
    ref = _reference_advantages(prompts, rewards, leave_one_out)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    assert ours[: 2 * g].abs().max() == 0


def test_one_success_in_sixteen_is_pushed_up_and_the_rest_down() -> None:
    # the success's fifteen others do not vary: its advantage is not divided (the reference's rule); each
    # failure's others hold the one success: (0 - 1/15) / sqrt(1/15)
    rewards = torch.zeros(16, dtype=torch.float64)
    rewards[5] = 1.0
    adv = grpo.group_advantages(rewards, 16)
    assert adv[5] == 1.0
    torch.testing.assert_close(adv[torch.arange(16) != 5], torch.full((15,), -(1 / 15) / (math.sqrt(1 / 15) + 1e-6),
                                                                       dtype=torch.float64))
    with pytest.raises(ValueError, match="whole groups"):
        grpo.group_advantages(torch.zeros(10), 16)


def _reference_loss(curr: torch.Tensor, gen: torch.Tensor, adv: torch.Tensor, token_mask: torch.Tensor,
                    sample_mask: torch.Tensor, global_toks: float) -> torch.Tensor:
    # loss_functions.py::ClippedPGLossFn.__call__ with the v6.1 settings (force_on_policy_ratio, seq-mask-tis
    # 0.999/1.002, importance-sampling correction, token-level), re-stated
    mask = token_mask * sample_mask.unsqueeze(-1)
    prev = curr.detach()
    ratios = (curr - curr.detach()).exp()
    clip_loss = torch.max(-adv * ratios, -adv * ratios)
    weights = torch.nan_to_num(torch.exp(prev - gen), nan=0.0, posinf=0.0, neginf=0.0)
    log_is = torch.nan_to_num(prev - gen, nan=0.0, posinf=0.0, neginf=0.0)
    geo = torch.exp(torch.sum(log_is * token_mask, dim=-1) / (token_mask.sum(-1) + 1e-8)).detach()
    kept = ((geo >= 0.999) & (geo <= 1.002)).float()
    weights = weights * kept.unsqueeze(-1)
    return torch.sum(weights * clip_loss * mask) / (global_toks + 1e-8)


def test_the_loss_and_its_gradient_equal_the_reference() -> None:
    gen = torch.Generator().manual_seed(5)
    b, t = 6, 9
    logits = torch.randn(b, t, generator=gen, dtype=torch.float64)
    gen_lp = torch.nn.functional.logsigmoid(logits).detach()
    drift = torch.zeros(b, t, dtype=torch.float64)
    drift[1] = 0.01  # outside the 0.999-1.002 geometric-mean band: dropped
    drift[2] = 0.0005
    token_mask = (torch.arange(t) < torch.tensor([9, 7, 5, 9, 3, 8]).unsqueeze(1)).double()
    keep = torch.tensor([1, 1, 1, 0, 1, 1], dtype=torch.float64)
    adv = torch.randn(b, generator=gen, dtype=torch.float64)
    grads = []
    for fn in ("ours", "ref"):
        x = logits.clone().requires_grad_(True)
        lp = torch.nn.functional.logsigmoid(x) + drift
        if fn == "ours":
            loss = grpo.clipped_pg_loss(lp, gen_lp, adv, token_mask, keep, float(token_mask.sum()))
        else:
            loss = _reference_loss(lp, gen_lp, adv.unsqueeze(-1), token_mask, keep, float(token_mask.sum()))
        loss.backward()
        grads.append((loss.detach(), x.grad))
    torch.testing.assert_close(grads[0][0], grads[1][0])
    torch.testing.assert_close(grads[0][1], grads[1][1])
    assert grads[0][1][1].abs().max() == 0 and grads[0][1][3].abs().max() == 0 and grads[0][1][2].abs().max() > 0


def test_the_ppo_ratio_is_clipped_when_not_forced_to_one() -> None:
    lp = torch.tensor([[0.0, 0.0]], requires_grad=True)
    prev = torch.log(torch.tensor([[0.5, 0.5]]))  # ratio 2: above 1.28
    config = grpo.PGLossConfig(force_on_policy_ratio=False, use_importance_sampling_correction=False)
    loss = grpo.clipped_pg_loss(lp, prev, torch.tensor([1.0]), torch.ones(1, 2), torch.ones(1), 2.0, config, prev)
    loss.backward()
    assert loss.item() == pytest.approx(-1.28, abs=1e-6) and lp.grad.abs().max() == 0


def test_sequence_masks_drop_truncated_and_disagreeing_sequences() -> None:
    gen = torch.zeros(3, 4)
    lp = torch.zeros(3, 4)
    lp[2] = -1.5  # exp(1.5) = 4.48 > 2
    keep = grpo.sample_mask(torch.tensor([False, True, False]), gen, lp, torch.ones(3, 4))
    assert keep.tolist() == [1.0, 0.0, 0.0]


def test_pass_at_k_is_the_observed_fraction_and_the_unbiased_estimator_agrees_at_n_equal_k() -> None:
    rewards = torch.tensor([0, 0, 1, 0, 0, 0, 0, 0, 1, 1, 1, 1], dtype=torch.float32)
    metrics = grpo.observed_pass_at_k(rewards, 4)
    assert metrics == {"pass@4": pytest.approx(2 / 3), "pass^4": pytest.approx(1 / 3),
                       "pass@1[avg-of-4]": pytest.approx(5 / 12)}
    assert grpo.unbiased_pass_at_k(4, 1, 4) == 1.0 and grpo.unbiased_pass_at_k(4, 0, 4) == 0.0
    assert grpo.unbiased_pass_at_k(10, 3, 4) == pytest.approx(1 - math.comb(7, 4) / math.comb(10, 4))
    with pytest.raises(ValueError):
        grpo.observed_pass_at_k(torch.zeros(5), 4)


def test_the_sandbox_is_safe_to_call_from_a_threaded_process() -> None:
    results: list[bool] = []
    if jail.landlock_abi() < 1:
        pytest.skip("no Landlock")

    def call() -> None:
        results.append(_run("print(1)").passed)

    threads = [threading.Thread(target=call) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [True, True, True]


def _tiny_llama(seed: int = 0) -> Llama:
    torch.manual_seed(seed)
    config = LlamaConfig(layers=2, dim=32, heads=4, kv_heads=2, ffn_dim=64, vocab_size=50, rope_theta=10_000.0,
                         rope_factor=0.0, init_std=0.2)
    model = Llama(config, max_seq_len=64)
    model.reset_parameters()
    return model


def _tiny_qwen35(seed: int = 0) -> Qwen35:
    torch.manual_seed(seed)
    config = Qwen35Config(layers=4, dim=32, vocab_size=50, heads=4, kv_heads=2, head_dim=16, rope_theta=10_000.0,
                          linear_k_heads=2, linear_v_heads=4, linear_k_dim=8, linear_v_dim=8, chunk=4,
                          moe=MoEConfig(experts=4, top_k=2, hidden=16, shared=1, shared_gate=True,
                                        scoring="softmax_topk", balance="none"), init_std=0.2)
    model = Qwen35(config, max_seq_len=64)
    model.reset_parameters()
    return model


@pytest.mark.parametrize("family", ["llama", "qwen35"])
def test_kv_cached_generation_gives_the_full_forwards_log_probs_under_left_padding(family: str) -> None:
    """The cache continues each row as its own unpadded sequence: attention keys masked, and Qwen3.5's
    DeltaNet layers (convolution window, recurrent state; chunked prefill, token-by-token steps) skipping
    the padding."""
    model = _tiny_llama() if family == "llama" else _tiny_qwen35()
    prompts = [[3, 7, 9, 11, 2, 6, 1, 5, 9, 10], [5], [8, 8, 1]]
    engine = TorchEngine(model)
    out = engine.generate(prompts, Sampling(max_new_tokens=12, stop=4), torch.Generator().manual_seed(0))
    assert out.tokens.shape[0] == 3 and out.generated_tokens == int(out.lengths.sum())
    for row, prompt in enumerate(prompts):
        n = int(out.lengths[row])
        completion = out.tokens[row, :n]
        full = torch.tensor(prompt + completion.tolist())[None]
        with torch.no_grad():
            logp = torch.log_softmax(model(full)[0].float(), -1)
        expected = logp[len(prompt) - 1:-1].gather(-1, completion[:, None])[:, 0]
        torch.testing.assert_close(out.logprobs[row, :n], expected, rtol=1e-4, atol=1e-4)
        assert out.truncated[row] == (4 not in completion.tolist())
        assert (out.tokens[row, n:] == 0).all() and (out.logprobs[row, n:] == 0).all()


def test_sampling_follows_temperature_and_top_p() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    kept = engine_mod.top_p_filter(logits, 0.7)
    assert torch.isfinite(kept).tolist() == [[True, True, False, False]]
    gen = torch.Generator().manual_seed(1)
    draws = torch.stack([engine_mod.sample(logits.repeat(4000, 1), Sampling(top_p=0.7), gen)[0]]).flatten()
    p = torch.softmax(logits[0, :2], -1)
    assert set(draws.tolist()) == {0, 1} and abs((draws == 0).float().mean() - p[0]) < 0.03
    greedy, logprob = engine_mod.sample(logits, Sampling(temperature=0), gen)
    assert greedy.item() == 0 and logprob.item() == pytest.approx(torch.log_softmax(logits, -1)[0, 0].item())


def test_a_separate_engine_copy_is_synced_with_the_trainers_weights() -> None:
    trainer, copy = _tiny_llama(0), _tiny_llama(1)
    engine = TorchEngine(copy, shared=False)
    assert isinstance(engine, RolloutEngine)
    moved = engine.load_weights(trainer.state_dict())
    assert moved == sum(t.numel() * t.element_size() for t in trainer.state_dict().values())
    prompts, sampling = [[1, 2, 3]], Sampling(temperature=0, max_new_tokens=6)
    a = engine.generate(prompts, sampling, torch.Generator())
    b = TorchEngine(trainer).generate(prompts, sampling, torch.Generator())
    assert torch.equal(a.tokens, b.tokens)


@landlock
def test_a_pool_runs_many_jobs_each_confined_to_its_own_folder() -> None:
    solution = "def f(x):\n    return 2 * x\n"
    with sandbox.Pool(workers=2) as pool:
        # a fresh pool names its first batch's folders j1, j2, ...: the second job tries its sibling's
        victim = sandbox.Job({"main.py": "import time\ntime.sleep(0.5)\nprint(open('t.txt').read())",
                              "t.txt": "untouched"}, "main.py")
        thief = sandbox.Job({"main.py": "open('../../j1/work/t.txt', 'w').write('passed')"}, "main.py")
        escapes = pool.run([victim, thief, *(sandbox.Job({"main.py": code}, "main.py", limits=sandbox.Limits(
            wall_s=1)) for code in ("import os\nos.fork()", "import time\ntime.sleep(60)",
                                     "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)",
                                     "import socket\nsocket.socket()", "x = bytearray(1 << 31)"))])
        assert escapes[0].passed and escapes[0].stdout == "untouched\n"
        assert [o.status for o in escapes[1:]] == ["failed", "failed", "timeout", "failed", "failed", "failed"]
        jobs = [sandbox.Job({"main.py": f"from solution import f\nassert f({i}) == {2 * i + (i == 3)}\n",
                             "solution.py": solution}, "main.py") for i in range(8)]
        assert [o.passed for o in pool.run(jobs)] == [i != 3 for i in range(8)]
        server = pool.proc
    assert server.poll() is not None and not pool.root.exists()


def test_completion_logprobs_equal_the_engines_for_the_same_weights() -> None:
    model = _tiny_llama(2)
    prompts = [[3, 7, 9], [5], [8, 8, 1, 2]]
    out = TorchEngine(model).generate(prompts, Sampling(max_new_tokens=7, stop=4), torch.Generator().manual_seed(3))
    logprobs, mask = loop.completion_logprobs(model, prompts, out)
    torch.testing.assert_close(logprobs * mask, out.logprobs, rtol=1e-4, atol=1e-4)
    assert mask.sum() == out.lengths.sum()


def test_grpo_steps_raise_a_verifiable_reward_and_time_each_phase() -> None:
    # reward: the completion's first token is even: GRPO must move the policy's mass there
    model = _tiny_llama(3)
    engine = TorchEngine(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    phases = loop.Phases()
    gen = torch.Generator().manual_seed(0)

    def rewarder(owner, rollouts):
        return (rollouts.tokens[:, 0] % 2 == 0).float()

    prompts = [[1, 2], [3], [4, 5, 6], [9]]
    sampling = Sampling(max_new_tokens=3)
    before = loop.evaluate_pass_at_k(engine, prompts, 4, Sampling(temperature=1.0, max_new_tokens=1), rewarder, gen)
    for _ in range(25):
        result = loop.grpo_step(model, optimizer, engine, prompts, 8, sampling, rewarder, gen, phases, micro_batch=12,
                                overlong_filtering=False)
    after = loop.evaluate_pass_at_k(engine, prompts, 4, Sampling(temperature=1.0, max_new_tokens=1), rewarder, gen)
    assert before["pass@1[avg-of-4]"] < 0.7 and after["pass@1[avg-of-4]"] > 0.95 and result.reward > 0.9
    rates = phases.rates()
    assert phases.rollout_tokens == 25 * 32 * 3 and rates["rollout_tokens_per_s"] > 0
    assert abs(sum(v for k, v in rates.items() if k.endswith("_share")) - 1) < 1e-9


def test_completions_cut_at_the_length_limit_do_not_train() -> None:
    model = _tiny_llama(4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    result = loop.grpo_step(model, optimizer, TorchEngine(model), [[1, 2], [3]], 4, Sampling(max_new_tokens=3),
                            lambda owner, r: torch.arange(len(owner)).float(), torch.Generator(), loop.Phases())
    assert result.kept == 0.0 and all(torch.equal(before[k], v) for k, v in model.state_dict().items())
