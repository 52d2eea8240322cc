"""Reinforcement-learning post-training shared by the post-training workloads: the sandbox that turns
a completion into a verifiable reward, group-relative advantages, the clipped policy-gradient loss,
pass@k, and the rollout engine boundary."""
