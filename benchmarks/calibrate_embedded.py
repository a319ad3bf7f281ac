"""Calibrate the embedded default job: SFT warm-start then GRPO on 2-digit addition.

Pure torch + transformers, single process, one thread. Answers two questions:
(a) which tiny-model size and SFT recipe lands near 40-55 % held-out exact match
fast, and (b) how much a plain GRPO loop (16 prompts x 8 samples, T=1, leave-one-out
baseline with std normalisation, token-level clipped policy gradient, AdamW, no KL)
gains within 60 steps, and with which optimizer settings.

Defaults: 4 layers (~1M params); SFT batch 16, lr 1e-3 constant after 20 warm-up steps, AdamW
betas (0.9, 0.98), stop at the first 50-step eval with val acc >= 0.45 (the demo stops at 40%,
checking every 10 steps once a check reached 20%: --sft-target 0.4 --sft-eval-every 10 comes
closer to it); GRPO lr 2e-4 continuing the SFT AdamW state (--grpo-keep-opt 1, as when one
trainer runs both phases), betas (0.9, 0.999), eps 1e-8, ratio clip 0.2, one optimizer step per
batch, token-level loss, no grad clip (the trainer clips at 1.0: --grad-clip 1), 4 new tokens.
Flags cover the variants tried (optimizer betas/eps/clip, loss aggregation, std normalisation,
minibatches, SFT annealing, SGD, and a positive-advantage-only diagnostic). The search of
2026-11-28 is in benchmarks/results/2026-11-28-demo.md: this simulation did not predict the real
demo there (it ranked GRPO lr 4e-4 first; the real demo gained less with it).

Example:
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/calibrate_embedded.py            # recommended defaults
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/calibrate_embedded.py --grpo-steps 0 --save-sft /tmp/sft.pt
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/calibrate_embedded.py --load-sft /tmp/sft.pt --grpo-seed 1
Prints one JSON line per evaluation and a final summary line.
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from calibrate_args import parse_args  # noqa: E402

from coordinator.embedded.arithmetic import NUM_PROBLEMS, make_arithmetic_splits  # noqa: E402
from coordinator.embedded.tiny_model import (  # noqa: E402
    TinyModelSpec,
    count_parameters,
    init_tiny_model,
)

IGNORE = -100


@dataclass(frozen=True)
class Vocab:
    """Token ids the loops need."""

    bos: int
    eos: int
    pad: int


def encode_prompts(tokenizer, rows: list[dict]) -> torch.Tensor:
    """BOS + prompt ids; all prompts have the same length in this task."""
    return torch.tensor([tokenizer(r["prompt"]).input_ids for r in rows])


def encode_sft_rows(tokenizer, vocab: Vocab, rows: list[dict]) -> list[tuple[list[int], list[int]]]:
    """(BOS+prompt+answer+EOS ids, labels masked to the answer part) per row."""
    out = []
    for r in rows:
        prompt = tokenizer(r["prompt"]).input_ids
        answer = tokenizer(r["answer"], add_special_tokens=False).input_ids + [vocab.eos]
        out.append((prompt + answer, [IGNORE] * len(prompt) + answer))
    return out


def collate(vocab: Vocab, items: list[tuple[list[int], list[int]]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad encoded rows into (ids, labels) tensors."""
    width = max(len(s) for s, _ in items)
    ids = torch.full((len(items), width), vocab.pad)
    lab = torch.full((len(items), width), IGNORE)
    for i, (s, l) in enumerate(items):
        ids[i, : len(s)] = torch.tensor(s)
        lab[i, : len(l)] = torch.tensor(l)
    return ids, lab


def next_token_logits(model, ids: torch.Tensor) -> torch.Tensor:
    """Logits for the token after ``ids`` (no padding inside ``ids``)."""
    return model(input_ids=ids).logits[:, -1, :].float()


@torch.no_grad()
def decode(model, prompts: torch.Tensor, max_new: int, eos: int, temperature: float, gen: torch.Generator | None):
    """Greedy (temperature 0) or sampled completions; returns new ids (B, max_new)."""
    ids = prompts
    for _ in range(max_new):
        logits = next_token_logits(model, ids)
        if temperature <= 0:
            nxt = logits.argmax(-1)
        else:
            probs = torch.softmax(logits / temperature, -1)
            nxt = torch.multinomial(probs, 1, generator=gen).squeeze(-1)
        ids = torch.cat([ids, nxt[:, None]], 1)
    return ids[:, prompts.shape[1] :]


def completion_mask(new_ids: torch.Tensor, eos: int) -> torch.Tensor:
    """1 for tokens up to and including the first EOS, 0 after it."""
    is_eos = (new_ids == eos).long()
    after = torch.cumsum(is_eos, 1) - is_eos  # number of EOS strictly before each position
    return (after == 0).float()


def completions_text(tokenizer, new_ids: torch.Tensor, eos: int) -> list[str | None]:
    """Decoded answer per row, or None when the row never emitted EOS."""
    out = []
    for row in new_ids.tolist():
        out.append(tokenizer.decode(row[: row.index(eos)]) if eos in row else None)
    return out


def rewards(texts: list[str | None], answers: list[str]) -> torch.Tensor:
    """Exact match (answer then EOS) as 1.0 / 0.0."""
    return torch.tensor([1.0 if t is not None and t.strip() == a else 0.0 for t, a in zip(texts, answers)])


def accuracy(model, tokenizer, vocab: Vocab, rows: list[dict], max_new: int) -> float:
    """Greedy exact-match accuracy on ``rows``."""
    model.eval()
    new = decode(model, encode_prompts(tokenizer, rows), max_new, vocab.eos, 0.0, None)
    model.train()
    return rewards(completions_text(tokenizer, new, vocab.eos), [r["answer"] for r in rows]).mean().item()


def log(record: dict) -> None:
    print(json.dumps(record), flush=True)


def run_sft(model, tokenizer, vocab, train, val, args) -> float:
    """Supervised warm start.

    Stop rules: ``--sft-target`` stops as soon as val accuracy reaches it; ``--sft-anneal-at``
    instead starts a cosine decay of the lr to 0 over ``--sft-anneal-steps`` steps once val
    accuracy reaches it, and stops at the end of the decay (so the warm start is a settled
    model, not a snapshot taken mid-way through the fast part of the learning curve)."""
    opt = torch.optim.AdamW(model.parameters(), lr=args.sft_lr, weight_decay=0.0, betas=(0.9, args.sft_beta2))
    rng = random.Random(args.seed)
    encoded = encode_sft_rows(tokenizer, vocab, train)
    t0 = time.perf_counter()
    acc = 0.0
    anneal_from = None  # step at which the anneal started
    for step in range(1, args.sft_steps + 1):
        warm = min(1.0, step / max(1, args.sft_warmup))
        decay = 0.5 * (1 + math.cos(math.pi * step / args.sft_steps)) if args.sft_cosine else 1.0
        lr = args.sft_lr * warm * (args.sft_min_lr_frac + (1 - args.sft_min_lr_frac) * decay)
        if anneal_from is not None:
            lr *= 0.5 * (1 + math.cos(math.pi * min(1.0, (step - anneal_from) / args.sft_anneal_steps)))
        for g in opt.param_groups:
            g["lr"] = lr
        ids, lab = collate(vocab, rng.sample(encoded, args.sft_bs))
        loss = model(input_ids=ids, labels=lab).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if args.sft_grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.sft_grad_clip)
        opt.step()
        done = anneal_from is not None and step - anneal_from >= args.sft_anneal_steps
        if step % args.sft_eval_every == 0 or step == args.sft_steps or done:
            el = time.perf_counter() - t0
            acc = accuracy(model, tokenizer, vocab, val, args.max_new)
            t0 += time.perf_counter() - t0 - el  # exclude evaluation time from train_s
            log({"phase": "sft", "step": step, "loss": round(loss.item(), 4), "lr": lr, "val_acc": acc,
                 "train_s": round(el, 2)})
            if done:
                break
            if args.sft_anneal_at and anneal_from is None and acc >= args.sft_anneal_at:
                anneal_from = step
            if not args.sft_anneal_at and args.sft_target and acc >= args.sft_target:
                break
    return acc, opt


def seq_logprobs(model, prompts: torch.Tensor, new_ids: torch.Tensor) -> torch.Tensor:
    """Per-token log-probs of ``new_ids`` given ``prompts`` under ``model``."""
    full = torch.cat([prompts, new_ids], 1)
    logits = model(input_ids=full).logits[:, prompts.shape[1] - 1 : -1, :].float()
    return torch.log_softmax(logits, -1).gather(-1, new_ids[..., None]).squeeze(-1)


def group_advantages(r: torch.Tensor, group: int, baseline: str = "loo", std_norm: bool = True,
                     eps: float = 1e-6) -> torch.Tensor:
    """Per-sample advantages: reward minus the group baseline (leave-one-out or plain mean),
    optionally divided by the group's reward std. Zero-variance groups get exactly 0."""
    g = r.view(-1, group)
    if baseline == "loo":
        base = (g.sum(1, keepdim=True) - g) / (group - 1)
    else:
        base = g.mean(1, keepdim=True)
    a = g - base
    if std_norm:
        a = a / (g.std(1, keepdim=True) + eps)
    return a.view(-1)


def loo_advantages(r: torch.Tensor, group: int, eps: float = 1e-6) -> torch.Tensor:
    """Leave-one-out baseline per group, divided by the group's reward std."""
    return group_advantages(r, group, "loo", True, eps)


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, how: str, max_new: int) -> torch.Tensor:
    """Reduce a (B, T) per-token objective over completion tokens.

    token: sum over all completion tokens / number of completion tokens in the (mini)batch;
    seq: mean over each sequence's tokens, then mean over sequences;
    const: sum / (B * max_new) (Dr.GRPO-style constant normaliser)."""
    if how == "token":
        return (per_token * mask).sum() / mask.sum().clamp_min(1.0)
    if how == "seq":
        return ((per_token * mask).sum(1) / mask.sum(1).clamp_min(1.0)).mean()
    if how == "const":
        return (per_token * mask).sum() / (per_token.shape[0] * max_new)
    raise ValueError(how)


def grpo_step(model, opt, tokenizer, vocab, rows, gen, args) -> dict:
    """One on-policy GRPO step (sample, score, one or more optimizer steps); returns statistics."""
    prompts = encode_prompts(tokenizer, rows).repeat_interleave(args.group, 0)
    answers = [r["answer"] for r in rows for _ in range(args.group)]
    model.eval()
    new = decode(model, prompts, args.max_new, vocab.eos, args.temperature, gen)
    model.train()
    mask = completion_mask(new, vocab.eos)
    r = rewards(completions_text(tokenizer, new, vocab.eos), answers)
    adv = group_advantages(r, args.group, args.baseline, bool(args.std_norm))
    if args.neg_adv_scale != 1.0:  # diagnostic: down-weight (0: drop) the negative-advantage samples
        adv = torch.where(adv < 0, adv * args.neg_adv_scale, adv)
    with torch.no_grad():
        old = seq_logprobs(model, prompts, new)
    n = prompts.shape[0]
    mb = n // max(1, args.minibatches)
    clipped, tokens, gnorms = 0.0, 0.0, []
    for _ in range(args.grpo_epochs):
        order = torch.randperm(n, generator=gen) if args.minibatches > 1 else torch.arange(n)
        for k in range(max(1, args.minibatches)):
            idx = order[k * mb : (k + 1) * mb]
            m = mask[idx]
            lp = seq_logprobs(model, prompts[idx], new[idx])
            ratio = torch.exp(lp - old[idx])
            a = adv[idx, None]
            surr = torch.minimum(ratio * a, ratio.clamp(1 - args.clip, 1 + args.clip) * a)
            loss = -aggregate(surr, m, args.loss_agg, args.max_new)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if args.grad_clip > 0:
                gnorms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)))
            opt.step()
            with torch.no_grad():
                clipped += float((((ratio - 1).abs() > args.clip).float() * m).sum())
                tokens += float(m.sum())
    zero = float((r.view(-1, args.group).std(1) == 0).float().mean())
    return {"reward": r.mean().item(), "zero_var": zero, "clip_frac": clipped / max(tokens, 1.0),
            "grad_norm": sum(gnorms) / len(gnorms) if gnorms else float("nan")}


@torch.no_grad()
def sampled_accuracy(model, tokenizer, vocab: Vocab, rows: list[dict], max_new: int, temperature: float,
                     seed: int) -> float:
    """Exact match of one sample per row at ``temperature`` (what GRPO's rollouts see)."""
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    new = decode(model, encode_prompts(tokenizer, rows), max_new, vocab.eos, temperature, gen)
    model.train()
    return rewards(completions_text(tokenizer, new, vocab.eos), [r["answer"] for r in rows]).mean().item()


def run_grpo(model, tokenizer, vocab, train, val, args, sft_opt_state: dict | None = None) -> list[float]:
    """GRPO loop with periodic held-out evaluation; returns accuracies per eval.

    With ``sft_opt_state`` (``--grpo-keep-opt``) the AdamW state of the warm start (moments and
    step count) carries on into GRPO, as when SFT and GRPO share one trainer; only lr, betas, eps
    and weight decay are replaced by the GRPO values."""
    if args.grpo_optim == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=args.grpo_lr, momentum=args.grpo_beta1,
                              weight_decay=args.grpo_wd)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=args.grpo_lr, betas=(args.grpo_beta1, args.grpo_beta2),
                                eps=args.grpo_eps, weight_decay=args.grpo_wd)
        if sft_opt_state is not None:
            opt.load_state_dict(sft_opt_state)
            for g in opt.param_groups:
                g.update(lr=args.grpo_lr, betas=(args.grpo_beta1, args.grpo_beta2), eps=args.grpo_eps,
                         weight_decay=args.grpo_wd)
                g.pop("initial_lr", None)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / max(1, args.grpo_warmup)))
    seed = args.seed if args.grpo_seed < 0 else args.grpo_seed
    rng = random.Random(seed + 1)
    gen = torch.Generator().manual_seed(seed + 2)
    accs = [accuracy(model, tokenizer, vocab, val, args.max_new)]
    samp = sampled_accuracy(model, tokenizer, vocab, val, args.max_new, args.temperature, 12345)
    log({"phase": "grpo", "step": 0, "val_acc": accs[0], "val_sampled_acc": samp})
    t0 = time.perf_counter()
    hist: list[dict] = []
    steps_per_batch = args.grpo_epochs * max(1, args.minibatches)
    for step in range(1, args.grpo_steps + 1):
        hist.append(grpo_step(model, opt, tokenizer, vocab, rng.sample(train, args.prompts), gen, args))
        for _ in range(steps_per_batch):
            sched.step()
        if step % args.grpo_eval_every == 0:
            el = time.perf_counter() - t0
            accs.append(accuracy(model, tokenizer, vocab, val, args.max_new))
            samp = sampled_accuracy(model, tokenizer, vocab, val, args.max_new, args.temperature, 12345)
            t0 += time.perf_counter() - t0 - el  # exclude evaluation time from s_per_step
            mean = {k: round(sum(h[k] for h in hist) / len(hist), 3) for k in hist[0]}
            log({"phase": "grpo", "step": step, "val_acc": accs[-1], "val_sampled_acc": samp,
                 "mean_train_reward": mean["reward"], "zero_var_groups": mean["zero_var"],
                 "clip_frac": mean["clip_frac"], "grad_norm": mean["grad_norm"], "s_per_step": round(el / step, 3)})
            hist = []
    return accs


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    spec = TinyModelSpec(hidden_size=args.hidden, intermediate_size=args.inter, num_layers=args.layers,
                         num_heads=args.heads, num_kv_heads=args.kv_heads, seed=args.seed)
    model, tokenizer = init_tiny_model(spec)
    model.train()
    vocab = Vocab(tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)
    train, val = make_arithmetic_splits(args.data_seed, NUM_PROBLEMS - args.num_val, args.num_val)
    log({"phase": "setup", "params": count_parameters(model), "spec": vars(args)})
    t0 = time.perf_counter()
    if args.load_sft:
        saved = torch.load(args.load_sft, weights_only=True)
        saved = saved if "model" in saved else {"model": saved, "opt": None}
        model.load_state_dict(saved["model"])
        opt_state = saved["opt"]
        sft_acc = accuracy(model, tokenizer, vocab, val, args.max_new)
    else:
        sft_acc, sft_opt = run_sft(model, tokenizer, vocab, train, val, args)
        opt_state = sft_opt.state_dict()
    if args.save_sft:
        torch.save({"model": model.state_dict(), "opt": opt_state}, args.save_sft)
    sft_s = time.perf_counter() - t0
    if args.grpo_keep_opt and opt_state is None:
        raise SystemExit("--grpo-keep-opt needs the SFT optimizer state (run SFT, or --load-sft a file saved by it)")
    accs = (run_grpo(model, tokenizer, vocab, train, val, args, opt_state if args.grpo_keep_opt else None)
            if args.grpo_steps else [sft_acc])
    log({"phase": "summary", "sft_acc": sft_acc, "sft_s": round(sft_s, 1), "grpo_accs": accs,
         "gain": round(accs[-1] - accs[0], 3), "total_s": round(time.perf_counter() - t0, 1)})


if __name__ == "__main__":
    main()
