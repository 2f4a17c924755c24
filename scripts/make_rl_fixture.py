#!/usr/bin/env python3
"""Writes tests/fixtures/rl/{reward,grpo,ppo}.json: the RL losses computed by trl's own code in float64.

tests/test_rl_math.cpp checks trainer/rl/ against them. Two runs, one per trl:

  python3 scripts/make_rl_fixture.py
      current trl (1.16.0): reward.json (RewardTrainer.compute_loss) and grpo.json
      (GRPOTrainer._compute_loss; the advantages re-implemented line by line from
      _generate_and_score_completions with trl's own nanstd).
  python3 -m venv /tmp/trl011 --system-site-packages && /tmp/trl011/bin/pip install trl==0.11.4
  /tmp/trl011/bin/python scripts/make_rl_fixture.py
      trl 0.11.4, the last with the classic PPOTrainer: ppo.json (PPOTrainer.compute_rewards,
      compute_advantages, loss, record_step_stats, AdaptiveKLController, FixedKLController;
      step()'s score clipping and mini-batch loop re-implemented line by line).

trl's methods run unbound on a stand-in `self` holding only the attributes they read (a
single process, no gradient accumulation), so the numbers are trl's code, not a copy of
it. Gradients come from torch autograd through those methods. Everything is float64 and
seeded; inputs are small (a few rows, 7 tokens, some masked).
"""
import json
import os
import sys
from collections import defaultdict
from types import SimpleNamespace

import torch
import trl

torch.set_default_dtype(torch.float64)
torch.manual_seed(0)
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "rl")
T = 7  # response / completion tokens per row


def versions():
    return {"trl": trl.__version__, "torch": torch.__version__, "dtype": "float64"}


def flat(t):
    return [float(x) for x in t.detach().reshape(-1)]


def scalar_stats(stats):
    """The stats that are one number (trl also logs whole tensors for histograms)."""
    out = {}
    for name, value in stats.items():
        if hasattr(value, "shape"):  # a torch tensor or numpy array
            if value.size == 0 or len(value.reshape(-1)) != 1:
                continue
            value = value.reshape(-1)[0]
        out[name] = float(value)
    return out


class OneProcess:
    """accelerate's Accelerator for a single process, as trl's methods call it."""

    num_processes = 1
    sync_gradients = True

    def gather(self, x):
        return x

    gather_for_metrics = gather

    def reduce(self, x, reduction="sum"):
        return x


def write(name, data):
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, name)
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    print("wrote", os.path.normpath(path))


# ---------------------------------------------------------------- reward (trl >= 1)
def reward_case(name, chosen, rejected, margins, center):
    from trl import RewardTrainer

    chosen, rejected = torch.tensor(chosen), torch.tensor(rejected)
    logits = torch.cat([chosen, rejected]).unsqueeze(-1).requires_grad_(True)
    self = SimpleNamespace(
        model=SimpleNamespace(training=True),
        args=SimpleNamespace(center_rewards_coefficient=center),
        accelerator=OneProcess(),
        _total_train_tokens=0,
        _tp_size=1,
        _metrics={"train": defaultdict(list)},
    )
    inputs = {"attention_mask": torch.ones(2 * len(chosen), 3, dtype=torch.long)}
    if margins is not None:
        inputs["margin"] = torch.tensor(margins)
    loss = RewardTrainer.compute_loss(self, lambda **kw: SimpleNamespace(logits=logits), inputs)
    loss.backward()
    grad = logits.grad.squeeze(-1)
    metrics = {k: v[-1] for k, v in self._metrics["train"].items() if k != "num_tokens"}
    return {
        "name": name,
        "chosen": flat(chosen),
        "rejected": flat(rejected),
        "margins": [] if margins is None else list(margins),
        "center_rewards_coefficient": center or 0.0,
        "loss": loss.item(),
        "dchosen": flat(grad[: len(chosen)]),
        "drejected": flat(grad[len(chosen) :]),
        "metrics": metrics,
    }


def make_reward():
    # The fourth pair ties: trl's accuracy counts chosen > rejected strictly.
    chosen = [1.5, -0.3, 0.8, 0.25, -2.0]
    rejected = [0.2, 0.9, -1.1, 0.25, -1.0]
    cases = [
        reward_case("no margin", chosen, rejected, None, None),
        reward_case("margin and centring", chosen, rejected, [0.5, 0.0, 1.0, 0.2, 3.0], 0.01),
    ]
    write("reward.json", {"versions": versions(), "cases": cases})


# ---------------------------------------------------------------- GRPO (trl >= 1)
def grpo_advantages(rewards, G, scale_rewards):
    """GRPOTrainer._generate_and_score_completions (trl 1.16.0), sum_then_normalize branch, line by line."""
    from trl.trainer.utils import nanstd

    mean_grouped_rewards = torch.nanmean(rewards.view(-1, G), dim=1).repeat_interleave(G, dim=0)
    if scale_rewards in ["group", "none"]:
        std_rewards = nanstd(rewards.view(-1, G), dim=1).repeat_interleave(G, dim=0)
    else:
        std_rewards = nanstd(rewards).expand_as(rewards)
    advantages = rewards - mean_grouped_rewards
    if scale_rewards != "none":
        advantages = advantages / (std_rewards + 1e-4)
    return advantages


def grpo_loss_case(name, config, logps, old_logps, ref_logps, mask, advantages, num_items_in_batch):
    from trl import GRPOTrainer

    rows = logps.shape[0]
    logps = logps.clone().requires_grad_(True)
    eps_high = config.get("epsilon_high")
    self = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (logps, torch.zeros_like(logps), None),
        aux_loss_enabled=False,
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level="token",
        beta=config["beta"],
        loss_type=config["loss_type"],
        epsilon_low=config["epsilon"],
        epsilon_high=eps_high if eps_high is not None else config["epsilon"],
        args=SimpleNamespace(
            use_bias_correction_kl=config["use_bias_correction_kl"], delta=config.get("delta"), steps_per_generation=1
        ),
        use_vllm=False,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        max_completion_length=config["max_completion_length"],
        accelerator=OneProcess(),
        _entropy_bonus_enabled=False,
        _metrics={"train": defaultdict(list)},
    )
    inputs = {
        "prompt_ids": torch.zeros(rows, 2, dtype=torch.long),
        "prompt_mask": torch.ones(rows, 2, dtype=torch.long),
        "completion_ids": torch.zeros(rows, T, dtype=torch.long),
        "completion_mask": mask,
        "advantages": advantages,
        "num_items_in_batch": torch.tensor(float(num_items_in_batch)),
    }
    if old_logps is not None:
        inputs["old_per_token_logps"] = old_logps
    if config["beta"] != 0.0:
        inputs["ref_per_token_logps"] = ref_logps
    loss = GRPOTrainer._compute_loss(self, None, inputs)
    loss.backward()
    metrics = {k: v[-1] for k, v in self._metrics["train"].items() if k != "entropy"}
    return {
        "name": name,
        "config": config,
        "rows": rows,
        "completion_tokens": T,
        "logps": flat(logps),
        "old_logps": [] if old_logps is None else flat(old_logps),
        "ref_logps": flat(ref_logps),
        "mask": [int(m) for m in mask.reshape(-1)],
        "advantages": flat(advantages),
        "num_items_in_batch": num_items_in_batch,
        "loss": loss.item(),
        "dlogps": flat(logps.grad),
        "metrics": metrics,
    }


def make_grpo():
    # Three groups of four; the second group's rewards are all equal (zero advantage).
    rewards = torch.tensor([1.0, 0.0, 0.5, 2.0, 0.7, 0.7, 0.7, 0.7, -1.0, 3.0, 0.2, 0.1])
    adv_cases = [
        {"rewards": flat(rewards), "group_size": 4, "scale_rewards": s, "advantages": flat(grpo_advantages(rewards, 4, s))}
        for s in ["group", "batch", "none"]
    ]
    rows = 8
    logps = -torch.rand(rows, T) * 3 - 0.05
    old_logps = logps + (torch.rand(rows, T) - 0.5) * 0.8  # ratios from about 0.67 to 1.5: both clips trigger
    ref_logps = logps + (torch.rand(rows, T) - 0.5) * 1.0
    lengths = [7, 5, 3, 7, 1, 6, 0, 4]  # row 6 has no completion token
    mask = torch.tensor([[1 if t < n else 0 for t in range(T)] for n in lengths], dtype=torch.long)
    advantages = grpo_advantages(rewards, 4, "group")[:rows]  # both signs, and zeros from the equal group

    def config(loss_type, beta, **kw):
        c = {"loss_type": loss_type, "beta": beta, "epsilon": 0.2, "epsilon_high": None, "delta": None,
             "max_completion_length": 10, "use_bias_correction_kl": True}
        c.update(kw)
        return c

    active = int(mask.sum())
    cases = [
        grpo_loss_case("grpo beta 0.04", config("grpo", 0.04), logps, old_logps, ref_logps, mask, advantages, active),
        grpo_loss_case("bnpo beta 0", config("bnpo", 0.0), logps, old_logps, ref_logps, mask, advantages, active),
        grpo_loss_case("dr_grpo beta 0.04", config("dr_grpo", 0.04), logps, old_logps, ref_logps, mask, advantages, active),
        grpo_loss_case("dapo beta 0, num_items_in_batch 40", config("dapo", 0.0), logps, old_logps, ref_logps, mask,
                       advantages, 40),
        grpo_loss_case("dapo beta 0.1, epsilon_high 0.28, no KL bias correction",
                       config("dapo", 0.1, epsilon_high=0.28, use_bias_correction_kl=False), logps, old_logps,
                       ref_logps, mask, advantages, active),
        grpo_loss_case("cispo beta 0.02, epsilon_high 1.1", config("cispo", 0.02, epsilon_high=1.1), logps, old_logps,
                       ref_logps, mask, advantages, active),
        grpo_loss_case("grpo delta 1.25", config("grpo", 0.0, delta=1.25), logps, old_logps, ref_logps, mask,
                       advantages, active),
        grpo_loss_case("bnpo on-policy beta 0.04", config("bnpo", 0.04), logps, None, ref_logps, mask, advantages,
                       active),
    ]
    write("grpo.json", {"versions": versions(), "advantages": adv_cases, "loss_cases": cases})


# ---------------------------------------------------------------- classic PPO (trl 0.11.4)
def ppo_step(name, config_kwargs, shifts, seed):
    """One PPOTrainer.step after the forward passes: rewards, advantages, the mini-batch losses
    (fixed permutations instead of np.random.permutation), the step's stats and the KL update."""
    from trl import PPOConfig, PPOTrainer
    from trl.core import entropy_from_logits, stack_dicts
    from trl.trainer.utils import AdaptiveKLController, FixedKLController

    gen = torch.Generator().manual_seed(seed)
    config = PPOConfig(**config_kwargs)
    kl_ctl = (AdaptiveKLController(config.init_kl_coef, config.target, config.horizon) if config.adap_kl_ctrl
              else FixedKLController(config.init_kl_coef))
    self = SimpleNamespace(config=config, kl_ctl=kl_ctl)
    self._kl_penalty = lambda lp, ref: PPOTrainer._kl_penalty(self, lp, ref)

    rows, V = config.batch_size, 5
    starts, ends = [0, 2, 0, 1], [7, 6, 4, 7]  # response windows: left offsets and right padding
    mask = torch.tensor([[1 if s <= t < e else 0 for t in range(T)] for s, e in zip(starts, ends)], dtype=torch.long)
    raw_scores = torch.tensor([1.8, -0.6, 0.3, -2.4])
    logprobs = -torch.rand(rows, T, generator=gen) * 3 - 0.1
    ref_logprobs = logprobs + (torch.rand(rows, T, generator=gen) - 0.4) * 0.8
    values = torch.randn(rows, T, generator=gen) * 0.5

    # step(): score clipping (trl 0.11.4 ppo_trainer.py, line by line).
    scores = raw_scores
    if config.score_clip is not None:
        scores = torch.clip(scores.float(), -config.score_clip, config.score_clip).to(dtype=scores.dtype)
    kl_coef = kl_ctl.value
    rewards, non_score_reward, kls = PPOTrainer.compute_rewards(self, scores, logprobs, ref_logprobs, mask)
    masked_values, advantages, returns = PPOTrainer.compute_advantages(self, values, rewards, mask)

    perms = [[0, 1, 2, 3], [3, 0, 1, 2]]
    mini_batches, all_stats = [], []
    for epoch in range(config.ppo_epochs):
        perm = perms[epoch % len(perms)]
        for start in range(0, rows, config.mini_batch_size):
            idx = perm[start : start + config.mini_batch_size]
            k = len(mini_batches)
            new_logprobs = (logprobs[idx] + (torch.rand(len(idx), T, generator=gen) - 0.5) * 0.7
                            + shifts.get(k, 0.0)).requires_grad_(True)
            vpreds = (masked_values[idx] + torch.randn(len(idx), T, generator=gen) * 0.3).requires_grad_(True)
            logits = torch.randn(len(idx), T, V, generator=gen)
            pg_loss, vf_term, stats = PPOTrainer.loss(self, logprobs[idx], masked_values[idx], logits, vpreds,
                                                      new_logprobs, mask[idx], advantages[idx], returns[idx])
            (pg_loss + vf_term).backward()  # train_minibatch's loss
            all_stats.append(stats)
            mini_batches.append({
                "indices": idx,
                "logprobs": flat(new_logprobs),
                "vpreds": flat(vpreds),
                "logits": flat(logits),
                "entropy_check": flat(entropy_from_logits(logits)),
                "dlogprobs": flat(new_logprobs.grad),
                "dvpreds": flat(vpreds.grad),
                "stats": scalar_stats(stats),
            })
    train_stats = stack_dicts(all_stats)
    train_stats["policy/advantages"] = torch.flatten(train_stats["policy/advantages"]).unsqueeze(0)
    train_stats["policy/ratio"] = torch.flatten(train_stats["policy/ratio"]).unsqueeze(0)
    responses = [torch.zeros(e - s, dtype=torch.long) for s, e in zip(starts, ends)]
    step_stats = PPOTrainer.record_step_stats(
        self, kl_coef=kl_coef, scores=scores, logprobs=logprobs, ref_logprobs=ref_logprobs,
        non_score_reward=non_score_reward, train_stats=train_stats, masks=mask,
        queries=[torch.zeros(3, dtype=torch.long)] * rows, responses=responses, kls=kls)
    step_stats = {k: v for k, v in scalar_stats(step_stats).items() if not k.startswith("tokens/")}
    kl_ctl.update(step_stats["objective/kl"], config.batch_size)
    return {
        "name": name,
        "config": {k: config_kwargs.get(k, getattr(config, k)) for k in [
            "adap_kl_ctrl", "init_kl_coef", "kl_penalty", "target", "horizon", "gamma", "lam", "cliprange",
            "cliprange_value", "vf_coef", "batch_size", "mini_batch_size", "ppo_epochs", "ratio_threshold",
            "whiten_rewards", "score_clip"]},
        "rows": rows, "response_tokens": T, "vocab": V,
        "scores": flat(raw_scores), "scores_clipped": flat(scores),
        "logprobs": flat(logprobs), "ref_logprobs": flat(ref_logprobs), "values": flat(values),
        "mask": [int(m) for m in mask.reshape(-1)],
        "kl_coef": kl_coef,
        "rewards": flat(rewards), "non_score_reward": flat(non_score_reward), "kls": flat(kls),
        "values_masked": flat(masked_values), "advantages": flat(advantages), "returns": flat(returns),
        "mini_batches": mini_batches,
        "stats": step_stats,
        "kl_coef_after": kl_ctl.value,
    }


def make_ppo():
    from trl import PPOTrainer
    from trl.trainer.utils import AdaptiveKLController, FixedKLController

    base = {"batch_size": 4, "mini_batch_size": 2, "ppo_epochs": 2}
    steps = [
        ppo_step("adaptive KL, kl penalty", dict(base), {}, 1),
        ppo_step("fixed KL, abs penalty, whitened rewards, score_clip 1",
                 dict(base, adap_kl_ctrl=False, init_kl_coef=0.05, kl_penalty="abs", whiten_rewards=True,
                      gamma=0.99, lam=0.9, score_clip=1.0, cliprange=0.1, cliprange_value=0.1), {}, 2),
        # The third mini-batch's ratios are about e^2.5: over ratio_threshold, trl zeroes its loss.
        ppo_step("mse penalty, a mini-batch over ratio_threshold",
                 dict(base, kl_penalty="mse", init_kl_coef=0.3, target=0.5, horizon=20), {2: 2.5}, 3),
    ]
    controllers = []
    for adaptive in [True, False]:
        ctl = AdaptiveKLController(0.2, 6.0, 10000) if adaptive else FixedKLController(0.2)
        updates = [[9.0, 128], [1.0, 256], [6.5, 64], [-3.0, 5000]]  # above, below, near the target; large n
        values = []
        for kl, n in updates:
            ctl.update(kl, n)
            values.append(ctl.value)
        controllers.append({"adaptive": adaptive, "init_kl_coef": 0.2, "target": 6.0, "horizon": 10000.0,
                            "updates": updates, "values": values})
    early_stops = []
    for early_stopping, target_kl, policykl in [(True, 1.0, 1.6), (True, 1.0, 1.4), (False, 1.0, 9.0), (True, 0.1, 0.2)]:
        self = SimpleNamespace(config=SimpleNamespace(early_stopping=early_stopping, target_kl=target_kl),
                               is_distributed=False, optimizer=SimpleNamespace(zero_grad=lambda: None))
        stop = PPOTrainer._early_stop(self, torch.tensor(policykl))
        early_stops.append({"early_stopping": early_stopping, "target_kl": target_kl, "policykl": policykl,
                            "stop": bool(stop)})
    write("ppo.json", {"versions": versions(), "kl_controllers": controllers, "early_stop": early_stops,
                       "steps": steps})


if __name__ == "__main__":
    torch.set_num_threads(1)
    if trl.__version__.startswith("0.11."):
        make_ppo()
    elif int(trl.__version__.split(".")[0]) >= 1:
        make_reward()
        make_grpo()
    else:
        sys.exit(f"trl {trl.__version__}: run with trl >= 1 (reward, GRPO) or trl 0.11.x (classic PPO)")
