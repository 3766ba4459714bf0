"""A small GPT-2-style causal LM trained by attsvm on the pydoc corpus (the KV-cache test bed).

``train_lm`` builds a byte-level BPE tokenizer from the training topics (``tokenizers``), trains a
``GPT2LMHeadModel`` with AdamW on random crops (one seeded ``torch.Generator``), and saves a normal
Hugging Face folder (``config.json``, ``model.safetensors``, ``tokenizer.json``) plus
``attsvm_lm.json`` (settings, losses, timings). A folder already holding a checkpoint trained with the
same settings is reused (the cache), so the command is cheap to repeat.

Held-out text: every ``heldout_every``-th topic (in name order) is never trained on.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._validation import check_finite_scalar, check_positive_int
from ._models import corpus_topics, set_offline

__all__ = ["LMConfig", "QUICK_LM", "TINY_LM", "split_corpus", "build_tokenizer", "train_lm", "load_lm",
           "default_lm_dir", "encode_heldout"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LMConfig:
    """Model, tokenizer and training settings (all seeded by ``seed``)."""

    vocab_size: int = 1024
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    n_positions: int = 512
    seq_len: int = 128
    batch_size: int = 12
    steps: int = 600
    lr: float = 3e-3
    weight_decay: float = 0.01
    seed: int = 0
    heldout_every: int = 10

    def __post_init__(self) -> None:
        for f in ("vocab_size", "n_layer", "n_head", "n_embd", "n_positions", "seq_len", "batch_size", "steps",
                  "heldout_every"):
            check_positive_int(getattr(self, f), f)
        check_positive_int(self.seed, "seed", minimum=0)
        check_finite_scalar(self.lr, "lr", positive=True)
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd must be divisible by n_head, got n_embd={self.n_embd}, n_head={self.n_head}")
        if self.seq_len > self.n_positions:
            raise ValueError(f"seq_len must be <= n_positions={self.n_positions}, got {self.seq_len}")
        if self.vocab_size < 260:
            raise ValueError(f"vocab_size must be >= 260 (256 bytes + specials), got {self.vocab_size}")


# minutes on CPU for `attsvm lm-train`; a few seconds for the tests
QUICK_LM = LMConfig(vocab_size=512, n_layer=2, n_head=2, n_embd=64, seq_len=96, batch_size=8, steps=150)
TINY_LM = LMConfig(vocab_size=300, n_layer=2, n_head=2, n_embd=32, n_positions=128, seq_len=64, batch_size=4,
                   steps=8)


def default_lm_dir(config: LMConfig) -> Path:
    """``$ATTSVM_CACHE`` (default ``~/.cache/attsvm``) / ``lm-<settings hash>``."""
    import hashlib

    root = Path(os.environ.get("ATTSVM_CACHE", Path.home() / ".cache" / "attsvm"))
    key = hashlib.sha1(json.dumps(dataclasses.asdict(config), sort_keys=True).encode()).hexdigest()[:10]
    return root / f"lm-{key}"


def split_corpus(heldout_every: int = 10) -> tuple[dict[str, str], dict[str, str]]:
    """``(train, heldout)`` topic dicts: every ``heldout_every``-th topic (name order, from the 5th) is held out."""
    heldout_every = check_positive_int(heldout_every, "heldout_every", minimum=2)
    topics = corpus_topics()
    names = list(topics)
    held = {n for i, n in enumerate(names) if i % heldout_every == heldout_every // 2}
    return ({n: t for n, t in topics.items() if n not in held}, {n: t for n, t in topics.items() if n in held})


def build_tokenizer(texts: list[str], vocab_size: int) -> Any:
    """A byte-level BPE tokenizer trained on ``texts``, wrapped as a ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tk.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>", bos_token="<|endoftext|>",
                                   unk_token="<|endoftext|>")


def _stream(tok: Any, texts: list[str]) -> Any:
    import torch

    ids: list[int] = []
    for t in texts:
        ids.extend(tok(t)["input_ids"])
        ids.append(tok.eos_token_id)
    return torch.tensor(ids, dtype=torch.long)


def _matches(folder: Path, config: LMConfig) -> bool:
    meta = folder / "attsvm_lm.json"
    if not (meta.is_file() and (folder / "config.json").is_file()):
        return False
    try:
        return json.loads(meta.read_text()).get("config") == dataclasses.asdict(config)
    except json.JSONDecodeError:
        return False


def train_lm(out: str | Path | None = None, config: LMConfig = LMConfig(), *, force: bool = False,
             progress: bool = False) -> Path:
    """Train (or reuse) the LM; returns its folder (loadable with :func:`load_lm`)."""
    import torch
    from tqdm.auto import tqdm
    from transformers import GPT2Config, GPT2LMHeadModel

    set_offline()
    if not isinstance(config, LMConfig):
        raise TypeError(f"config must be an LMConfig, got {type(config).__name__}")
    folder = Path(out) if out is not None else default_lm_dir(config)
    if not force and _matches(folder, config):
        log.info("reusing the LM checkpoint in %s", folder)
        return folder
    t0 = time.perf_counter()
    torch.manual_seed(config.seed)  # parameter initialisation inside transformers draws from the global RNG
    gen = torch.Generator().manual_seed(config.seed)
    train, held = split_corpus(config.heldout_every)
    tok = build_tokenizer(list(train.values()), config.vocab_size)
    data = _stream(tok, list(train.values()))
    val = _stream(tok, list(held.values()))
    cfg = GPT2Config(vocab_size=len(tok), n_positions=config.n_positions, n_embd=config.n_embd,
                     n_layer=config.n_layer, n_head=config.n_head, bos_token_id=tok.eos_token_id,
                     eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(cfg)
    model.config._attn_implementation = "eager"
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay, betas=(0.9, 0.95))
    warm = max(1, config.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(s, config.steps) / config.steps)))
    L = config.seq_len
    losses = []
    for _ in tqdm(range(config.steps), desc="lm-train", disable=not progress, leave=False):
        starts = torch.randint(0, len(data) - L - 1, (config.batch_size,), generator=gen)
        batch = torch.stack([data[s:s + L] for s in starts.tolist()])  # (B, L)
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
    model.eval()
    with torch.no_grad():
        n = (len(val) - 1) // L
        chunks = val[: n * L].view(n, L)[:64]
        val_loss = float(model(input_ids=chunks, labels=chunks).loss) if n else float("nan")
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    meta = {"config": dataclasses.asdict(config), "train_loss_last50": float(sum(losses[-50:]) / len(losses[-50:])),
            "train_loss_first": losses[0], "heldout_loss": val_loss, "heldout_ppl": math.exp(val_loss),
            "n_params": sum(p.numel() for p in model.parameters()), "train_tokens": len(data),
            "heldout_tokens": len(val), "heldout_topics": sorted(held), "seconds": time.perf_counter() - t0}
    (folder / "attsvm_lm.json").write_text(json.dumps(meta, indent=1))
    log.info("trained LM in %.0f s: held-out loss %.3f (ppl %.1f)", meta["seconds"], val_loss, meta["heldout_ppl"])
    return folder


def load_lm(folder: str | Path) -> tuple[Any, Any]:
    """Load a folder written by :func:`train_lm`: ``(GPT2LMHeadModel in eval mode with eager attention, tokenizer)``."""
    from ._models import load_model

    folder = Path(folder)
    if not (folder / "attsvm_lm.json").is_file():
        raise FileNotFoundError(f"{str(folder)!r} is not an attsvm LM checkpoint (no attsvm_lm.json); "
                                "train one with `attsvm lm-train`")
    return load_model(folder, causal_lm=True)


def encode_heldout(tok: Any, config: LMConfig, *, n_seq: int, seq_len: int) -> Any:
    """``n_seq`` held-out token sequences (n_seq, seq_len) cut consecutively from the held-out topics."""
    _, held = split_corpus(config.heldout_every)
    ids = _stream(tok, list(held.values()))
    n = min(n_seq, len(ids) // seq_len)
    if n < 1:
        raise ValueError(f"held-out text has only {len(ids)} tokens; seq_len={seq_len} is too long")
    return ids[: n * seq_len].view(n, seq_len)
