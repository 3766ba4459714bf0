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

from .._folders import cache_root
from .._validation import check_bool, check_finite_scalar, check_positive_int, check_seed
from ._models import corpus_topics, set_offline

__all__ = [
    "LMConfig",
    "QUICK_LM",
    "TINY_LM",
    "split_corpus",
    "build_tokenizer",
    "train_lm",
    "load_lm",
    "default_lm_dir",
    "encode_heldout",
    "LlamaLMConfig",
    "RETRIEVAL_LM",
    "QUICK_RETRIEVAL_LM",
    "TINY_RETRIEVAL_LM",
    "build_word_tokenizer",
    "train_llama_lm",
    "load_llama_lm",
    "generate_answer",
    "full_cache_accuracy",
    "heldout_perplexity",
    "cache_kw",
    "encode_query",
    "decode_answer",
]

log = logging.getLogger(__name__)


def _check_weight_decay(value: Any) -> float:
    wd = check_finite_scalar(value, "weight_decay")
    if wd < 0:
        raise ValueError(f"weight_decay must be >= 0, got {wd}")
    return wd


def _check_at_most(value: Any, name: str, limit: float, why: str) -> float:
    """A positive finite ``value`` no larger than ``limit`` (beyond it training overflows: ``why``)."""
    out = check_finite_scalar(value, name, positive=True)
    if out > limit:
        raise ValueError(f"{name} must be <= {limit:g} ({why}), got {out:g}")
    return out


def _folder(folder: Any) -> Path:
    if not isinstance(folder, (str, os.PathLike)):
        raise TypeError(f"folder must be a path (str or Path) to an LM checkpoint, got {type(folder).__name__}")
    return Path(folder)


def _check_texts(texts: Any) -> list[str]:
    """A list of texts (a bare string would be iterated character by character)."""
    if isinstance(texts, (str, bytes)) or not hasattr(texts, "__iter__"):
        raise TypeError(f"texts must be a list of strings, got {type(texts).__name__}")
    out = list(texts)
    if not all(isinstance(t, str) for t in out):
        raise TypeError("texts must be a list of strings")
    return out


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
        for f in (
            "vocab_size",
            "n_layer",
            "n_head",
            "n_embd",
            "n_positions",
            "seq_len",
            "batch_size",
            "steps",
        ):
            check_positive_int(getattr(self, f), f)
        check_positive_int(self.heldout_every, "heldout_every", minimum=2)
        check_seed(self.seed)
        _check_at_most(self.lr, "lr", 1.0, "an AdamW step moves each weight by about lr")
        _check_weight_decay(self.weight_decay)
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd must be divisible by n_head, got n_embd={self.n_embd}, n_head={self.n_head}")
        if self.seq_len > self.n_positions:
            raise ValueError(f"seq_len must be <= n_positions={self.n_positions}, got {self.seq_len}")
        if self.vocab_size < 260:
            raise ValueError(f"vocab_size must be >= 260 (256 bytes + specials), got {self.vocab_size}")


# minutes on CPU for `attsvm lm-train`; a few seconds for the tests
QUICK_LM = LMConfig(vocab_size=512, n_layer=2, n_head=2, n_embd=64, seq_len=96, batch_size=8, steps=150)
TINY_LM = LMConfig(vocab_size=300, n_layer=2, n_head=2, n_embd=32, n_positions=128, seq_len=64, batch_size=4, steps=8)


def default_lm_dir(config: LMConfig | LlamaLMConfig) -> Path:
    """``$ATTSVM_CACHE`` (default ``~/.cache/attsvm``) / ``lm-<settings hash>`` (``llama-lm-<hash>`` for a
    :class:`LlamaLMConfig`)."""
    import hashlib

    if not isinstance(config, (LMConfig, LlamaLMConfig)):
        raise TypeError(f"config must be an LMConfig or a LlamaLMConfig, got {type(config).__name__}")
    root = cache_root()
    key = hashlib.sha1(json.dumps(dataclasses.asdict(config), sort_keys=True).encode()).hexdigest()[:10]
    prefix = "llama-lm" if isinstance(config, LlamaLMConfig) else "lm"
    return root / f"{prefix}-{key}"


def split_corpus(heldout_every: int = 10) -> tuple[dict[str, str], dict[str, str]]:
    """``(train, heldout)`` topic dicts: every ``heldout_every``-th topic (name order, from the 5th) is held out."""
    heldout_every = check_positive_int(heldout_every, "heldout_every", minimum=2)
    topics = corpus_topics()
    names = list(topics)
    held = {n for i, n in enumerate(names) if i % heldout_every == heldout_every // 2}
    if not held:
        raise ValueError(
            f"heldout_every={heldout_every} holds out no topic: the corpus has {len(names)} topics (the first "
            f"held out is number heldout_every // 2 + 1)"
        )
    return ({n: t for n, t in topics.items() if n not in held}, {n: t for n, t in topics.items() if n in held})


def build_tokenizer(texts: list[str], vocab_size: int) -> Any:
    """A byte-level BPE tokenizer trained on ``texts``, wrapped as a ``PreTrainedTokenizerFast``
    (``vocab_size`` >= 257: the 256 bytes and the end-of-text token)."""
    texts = _check_texts(texts)
    vocab_size = check_positive_int(vocab_size, "vocab_size", minimum=257)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, eos_token="<|endoftext|>", bos_token="<|endoftext|>", unk_token="<|endoftext|>"
    )


def _stream(tok: Any, texts: list[str]) -> Any:
    import torch

    ids: list[int] = []
    for t in texts:
        ids.extend(tok(t)["input_ids"])
        ids.append(tok.eos_token_id)
    return torch.tensor(ids, dtype=torch.long)


def _matches(folder: Path, config: LMConfig | LlamaLMConfig) -> bool:
    meta = folder / "attsvm_lm.json"
    if not (meta.is_file() and (folder / "config.json").is_file()):
        return False
    try:
        return json.loads(meta.read_text()).get("config") == dataclasses.asdict(config)
    except json.JSONDecodeError:
        return False


def train_lm(
    out: str | Path | None = None, config: LMConfig = LMConfig(), *, force: bool = False, progress: bool = False
) -> Path:
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
    cfg = GPT2Config(
        vocab_size=len(tok),
        n_positions=config.n_positions,
        n_embd=config.n_embd,
        n_layer=config.n_layer,
        n_head=config.n_head,
        bos_token_id=tok.eos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.eos_token_id,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    model = GPT2LMHeadModel(cfg)
    model.config._attn_implementation = "eager"
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay, betas=(0.9, 0.95))
    lr_warmup = max(1, config.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: min(1.0, (s + 1) / lr_warmup) * 0.5 * (1 + math.cos(math.pi * min(s, config.steps) / config.steps)),
    )
    L = config.seq_len
    losses = []
    for _ in tqdm(range(config.steps), desc="lm-train", disable=not progress, leave=False):
        starts = torch.randint(0, len(data) - L - 1, (config.batch_size,), generator=gen)
        batch = torch.stack([data[s : s + L] for s in starts.tolist()])  # (B, L)
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
    meta = {
        "config": dataclasses.asdict(config),
        "train_loss_last50": float(sum(losses[-50:]) / len(losses[-50:])),
        "train_loss_first": losses[0],
        "heldout_loss": val_loss,
        "heldout_ppl": math.exp(val_loss),
        "n_params": sum(p.numel() for p in model.parameters()),
        "train_tokens": len(data),
        "heldout_tokens": len(val),
        "heldout_topics": sorted(held),
        "seconds": time.perf_counter() - t0,
    }
    (folder / "attsvm_lm.json").write_text(json.dumps(meta, indent=1))
    log.info("trained LM in %.0f s: held-out loss %.3f (ppl %.1f)", meta["seconds"], val_loss, meta["heldout_ppl"])
    return folder


def load_lm(folder: str | Path) -> tuple[Any, Any]:
    """Load a folder written by :func:`train_lm`: ``(GPT2LMHeadModel in eval mode with eager attention, tokenizer)``."""
    from ._models import load_model

    folder = _folder(folder)
    if not (folder / "attsvm_lm.json").is_file():
        raise FileNotFoundError(
            f"{str(folder)!r} is not an attsvm LM checkpoint (no attsvm_lm.json); train one with `attsvm lm-train`"
        )
    return load_model(folder, causal_lm=True)


def encode_heldout(tok: Any, config: LMConfig, *, n_seq: int, seq_len: int) -> Any:
    """``n_seq`` held-out token sequences (n_seq, seq_len) cut consecutively from the held-out topics."""
    n_seq = check_positive_int(n_seq, "n_seq")
    seq_len = check_positive_int(seq_len, "seq_len")
    if not isinstance(config, LMConfig):
        raise TypeError(f"config must be an LMConfig, got {type(config).__name__}")
    _, held = split_corpus(config.heldout_every)
    ids = _stream(tok, list(held.values()))
    n = min(n_seq, len(ids) // seq_len)
    if n < 1:
        raise ValueError(f"held-out text has only {len(ids)} tokens; seq_len={seq_len} is too long")
    return ids[: n * seq_len].view(n, seq_len)


# ------------------------------------------------------------------------------------------ Llama variant
# A small LlamaForCausalLM (RoPE, grouped-query attention) trained on the pydoc corpus with the retrieval tasks
# of :mod:`attsvm.analysis.tasks` inserted into it: the KV-cache test bed where the answer depends on a few
# far-away tokens. The tokenizer is word-level (a word = one token; rare words map to [UNK]), so that keys and
# values are single tokens and a context of ``n_tokens`` words is ``n_tokens`` tokens.

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "[UNK]")


@dataclass(frozen=True)
class LlamaLMConfig:
    """Model, tokenizer, curriculum and training settings of the retrieval LM (all seeded by ``seed``).

    Each step draws ``max(2, tokens_per_step // L)`` sequences of context length ``L``: ``L`` stays in
    ``[min_len, 2 min_len]`` for the first ``hold`` fraction of the steps, grows geometrically to ``max_len`` by
    ``ramp``, then stays in ``[max_len / 2, max_len]``. A share ``repeat_share`` of the sequences are random
    key/value codes written twice, ``drill_share`` are recall drills (pydoc text with many needles, then some of
    them again), the rest pydoc text with one task example of :mod:`attsvm.analysis.tasks`; the loss is the
    next-token loss on all tokens plus ``answer_weight`` times the loss on the tokens to retrieve.

    Every task is solved by an induction head (a previous-token head in layer 1, a content match on its output
    in layer 2). Variable tracking, which chains three such look-ups, needs all three of these settings: with any
    one turned back the other tasks still reach 1.00 but variable tracking falls below the 0.9 bar (0.87 without
    biases, 0.40 without the warm phase, 0.20 with base 10,000; 10 contexts per task at 1,024 tokens,
    ``benchmarks/bench_retrieval_lm.py``). The earlier recipe, with none of them, 2,400 steps, ``init_std=0.1``
    and ``lr=3e-3``, stayed far below the bar (mqar 0.10, variable tracking 0.13).

    - ``attention_bias``: q/k/v/o projections with a bias (Qwen2 has q/k/v biases). A previous-token head attends by
      position alone; under RoPE without biases the queries and keys of every token must first grow a shared
      component. On repeated random codes alone (``init_std=0.1``, ``lr=3e-3``), the answer loss was still 3.6
      after 900 steps without biases and 1.3 with them.
    - ``warm``: the first ``warm`` fraction of the steps draws a share ``warm_repeat_share`` of repeated random
      codes (no drills), the cleanest induction signal.
    - ``rope_theta``: a slow RoPE base (Llama 3's 500,000). A content match between tokens ~1,000 positions
      apart can only use the dimensions that RoPE barely rotates over that distance; with base 10,000 a head of
      32 dimensions has about 6 of them, with 500,000 about 12.
    """

    vocab_size: int = 1024
    n_layer: int = 2
    n_head: int = 4
    n_kv_head: int = 2
    n_embd: int = 64
    head_dim: int = 32
    intermediate_size: int = 192
    max_position_embeddings: int = 4096
    rope_theta: float = 500_000.0
    attention_bias: bool = True
    min_len: int = 32
    max_len: int = 1152
    hold: float = 0.3
    ramp: float = 0.8
    tokens_per_step: int = 1024
    steps: int = 6000
    lr: float = 2e-3
    weight_decay: float = 0.01
    init_std: float = 0.02
    answer_weight: float = 3.0
    repeat_share: float = 0.1
    drill_share: float = 0.4
    warm: float = 0.25
    warm_repeat_share: float = 0.95
    eval_tokens: int = 1024
    eval_samples: int = 10
    seed: int = 0
    heldout_every: int = 10

    def __post_init__(self) -> None:
        for f in (
            "vocab_size",
            "n_layer",
            "n_head",
            "n_kv_head",
            "n_embd",
            "head_dim",
            "intermediate_size",
            "max_position_embeddings",
            "min_len",
            "max_len",
            "tokens_per_step",
            "steps",
            "eval_tokens",
            "eval_samples",
        ):
            check_positive_int(getattr(self, f), f)
        check_positive_int(self.heldout_every, "heldout_every", minimum=2)
        check_seed(self.seed)
        _check_at_most(self.lr, "lr", 1.0, "an AdamW step moves each weight by about lr")
        _check_weight_decay(self.weight_decay)
        if check_finite_scalar(self.answer_weight, "answer_weight") < 0:
            raise ValueError(
                f"answer_weight must be >= 0 (a weight on the answer tokens' loss), got {self.answer_weight}"
            )
        if self.answer_weight > 1e6:
            raise ValueError(
                f"answer_weight must be <= 1e6 (it multiplies the answer loss; beyond, the loss overflows), got "
                f"{self.answer_weight:g}"
            )
        _check_at_most(self.init_std, "init_std", 1.0, "the standard deviation of the initial weights")
        if check_finite_scalar(self.rope_theta, "rope_theta", positive=True) <= 1.0:
            raise ValueError(
                f"rope_theta must be > 1 (the RoPE base: frequencies rope_theta^(-2i/d) must fall), got "
                f"{self.rope_theta:g}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even (RoPE rotates pairs of coordinates), got {self.head_dim}")
        object.__setattr__(self, "attention_bias", check_bool(self.attention_bias, "attention_bias"))
        for name in ("warm", "warm_repeat_share", "repeat_share", "drill_share", "hold", "ramp"):
            check_finite_scalar(getattr(self, name), name)
        if not (0.0 <= self.warm < 1.0 and 0.0 <= self.warm_repeat_share <= 1.0):
            raise ValueError(
                f"warm must be in [0, 1) and warm_repeat_share in [0, 1], got {self.warm}, {self.warm_repeat_share}"
            )
        if not (0.0 <= self.repeat_share and 0.0 <= self.drill_share and self.repeat_share + self.drill_share < 1.0):
            raise ValueError(
                f"repeat_share and drill_share must be >= 0 with a sum < 1, got {self.repeat_share}, {self.drill_share}"
            )
        if not 0.0 <= self.hold < self.ramp <= 1.0:
            raise ValueError(
                f"hold and ramp must satisfy 0 <= hold < ramp <= 1, got hold={self.hold}, ramp={self.ramp}"
            )
        if self.n_head % self.n_kv_head:
            raise ValueError(
                f"n_head must be divisible by n_kv_head, got n_head={self.n_head}, n_kv_head={self.n_kv_head}"
            )
        if not 32 <= 2 * self.min_len <= self.max_len:
            raise ValueError(f"min_len must be in [32, max_len / 2={self.max_len // 2}], got {self.min_len}")
        if self.max_len + 64 > self.max_position_embeddings:
            raise ValueError(
                f"max_len + 64 must be <= max_position_embeddings={self.max_position_embeddings}, "
                f"got max_len={self.max_len}"
            )
        if self.vocab_size < 512:
            raise ValueError(f"vocab_size must be >= 512 (specials, task codes and words), got {self.vocab_size}")


# the default: 1,024-token tasks; a few minutes on 2 CPU cores
RETRIEVAL_LM = LlamaLMConfig()
# kv-compare --quick and the CI: 256-token tasks
QUICK_RETRIEVAL_LM = LlamaLMConfig(max_len=288, steps=300, eval_tokens=256)
# the tests' training code path (seconds; learns nothing)
TINY_RETRIEVAL_LM = LlamaLMConfig(
    vocab_size=512,
    n_embd=32,
    head_dim=8,
    intermediate_size=64,
    min_len=32,
    max_len=64,
    tokens_per_step=128,
    steps=3,
    eval_tokens=48,
    eval_samples=2,
    max_position_embeddings=256,
)


def build_word_tokenizer(texts: list[str], vocab_size: int) -> Any:
    """A word-level tokenizer (``PreTrainedTokenizerFast``): specials, the task words and codes of
    :mod:`attsvm.analysis.tasks`, then the most frequent words of ``texts`` up to ``vocab_size`` entries;
    anything else is ``[UNK]``. Words follow :data:`attsvm.analysis.tasks.WORD_PATTERN`; decoding joins
    tokens with spaces."""
    from collections import Counter

    texts = _check_texts(texts)
    vocab_size = check_positive_int(vocab_size, "vocab_size")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from .tasks import KEY_CODES, TASK_WORDS, VALUE_CODES, split_words

    vocab: dict[str, int] = {}
    for w in (*SPECIAL_TOKENS, *TASK_WORDS, *KEY_CODES, *VALUE_CODES):
        vocab.setdefault(w, len(vocab))
    if len(vocab) > vocab_size:
        raise ValueError(f"vocab_size must be >= {len(vocab)}, got {vocab_size}")
    counts = Counter(w for t in texts for w in split_words(t))
    for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if len(vocab) >= vocab_size:
            break
        vocab.setdefault(w, len(vocab))
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="[UNK]",
        model_max_length=4096,
    )
    return tok


def _curriculum_len(config: LlamaLMConfig, step: int, rng: Any) -> int:
    """Context length of a step: in ``[min_len, 2 min_len]`` for the first ``hold`` of the steps (while the
    induction heads form), then a geometric ramp to ``max_len`` reached at ``ramp``, drawn in ``[top / 2, top]``."""
    lo = config.min_len
    if step < config.hold * config.steps:
        return int(rng.integers(lo, 2 * lo + 1))
    frac = min(1.0, (step - config.hold * config.steps) / max(1.0, (config.ramp - config.hold) * config.steps))
    top = 2 * lo * (config.max_len / (2 * lo)) ** frac
    return int(rng.integers(max(lo, int(top) // 2), int(top) + 1))


def _drill(rng: Any, words: Any, n_tokens: int) -> tuple[str, list[str]]:
    """A recall drill (training only): pydoc text with ``n_tokens // 8`` needles ``k v .``, then up to 16 of
    the pairs again; ``(text, values to predict)``. Dense induction signal: every repeated value is predictable."""
    from .tasks import KEY_CODES, VALUE_CODES, _haystack, _insert

    n_pairs = max(1, min(len(KEY_CODES), n_tokens // 8))
    keys = [KEY_CODES[i] for i in rng.choice(len(KEY_CODES), size=n_pairs, replace=False)]
    values = [VALUE_CODES[i] for i in rng.integers(0, len(VALUE_CODES), size=n_pairs)]
    needles = [[k, v, "."] for k, v in zip(keys, values)]
    hay = _insert(_haystack(words, rng, max(1, n_tokens - 3 * n_pairs)), needles, rng)
    asked = rng.permutation(n_pairs)[:16].tolist()
    tail = [w for i in asked for w in (keys[i], values[i], ".")]
    return " ".join(hay + tail), [values[i] for i in asked]


def _task_batch(
    tok: Any, rng: Any, words: Any, n_tokens: int, batch: int, drill: float = 0.3, repeat: float = 0.3
) -> tuple[Any, Any, Any]:
    """``(ids, labels, answer_mask)`` of ``batch`` training sequences (B, T); labels -100 on padding.

    A share ``repeat`` of the sequences are random key/value codes written twice (the second copy is predictable
    by induction only), a share ``drill`` are recall drills (:func:`_drill`), the others task examples (context,
    question, answer prefix, answer, ``</s>``); the answer mask marks the tokens to retrieve."""
    import numpy as np
    import torch

    from .tasks import KEY_CODES, TASKS, VALUE_CODES, sample_example

    code_ids = np.asarray(tok.convert_tokens_to_ids([*KEY_CODES, *VALUE_CODES]))
    seqs, masks = [], []
    for _ in range(batch):
        u = rng.random()
        if u < repeat:  # random codes written twice: only induction predicts the second copy
            half = max(2, n_tokens // 2)
            win = code_ids[rng.integers(0, len(code_ids), size=half)].tolist()
            seqs.append([tok.bos_token_id, *win, *win])
            masks.append([False] * (1 + len(win) + 1) + [True] * (len(win) - 1))
            continue
        if u < repeat + drill:
            text, vals = _drill(rng, words, n_tokens)
            drill_ids = [tok.bos_token_id, *tok.encode(text, add_special_tokens=False)]
            tail = len(vals) * 3
            vset = set(tok.convert_tokens_to_ids(vals))
            m = [False] * (len(drill_ids) - tail) + [
                i in vset and j % 3 == 1 for j, i in enumerate(drill_ids[len(drill_ids) - tail :])
            ]
            seqs.append(drill_ids)
            masks.append(m)
            continue
        task = TASKS[int(rng.integers(len(TASKS)))]
        ex = sample_example(task, rng, words, n_tokens)
        question, prefix, answers = ex.queries[int(rng.integers(len(ex.queries)))]
        head = tok.encode(f"{ex.context} {question} {prefix}", add_special_tokens=False)
        ans = [*tok.encode(" ".join(answers), add_special_tokens=False), tok.eos_token_id]
        seqs.append([tok.bos_token_id, *head, *ans])
        masks.append([False] * (1 + len(head)) + [True] * len(ans))
    T = max(len(s) for s in seqs)
    ids = torch.full((batch, T), tok.pad_token_id, dtype=torch.long)
    labels = torch.full((batch, T), -100, dtype=torch.long)
    amask = torch.zeros((batch, T), dtype=torch.bool)
    for b, (seq, m) in enumerate(zip(seqs, masks)):
        ids[b, : len(seq)] = torch.tensor(seq)
        labels[b, : len(seq)] = ids[b, : len(seq)]
        amask[b, : len(seq)] = torch.tensor(m)
    return ids, labels, amask


def train_llama_lm(
    out: str | Path | None = None, config: LlamaLMConfig = RETRIEVAL_LM, *, force: bool = False, progress: bool = False
) -> Path:
    """Train (or reuse) the retrieval LM; returns its folder (loadable with :func:`load_llama_lm`).

    The folder is a normal Hugging Face checkpoint plus ``attsvm_lm.json`` (settings, losses, held-out
    perplexity, full-cache accuracy per task on held-out filler, seconds). A folder holding a checkpoint
    trained with the same settings is reused.
    """
    import numpy as np
    import torch
    from tqdm.auto import tqdm
    from transformers import LlamaConfig, LlamaForCausalLM

    from .tasks import filler_words

    set_offline()
    if not isinstance(config, LlamaLMConfig):
        raise TypeError(f"config must be a LlamaLMConfig, got {type(config).__name__}")
    folder = Path(out) if out is not None else default_lm_dir(config)
    if not force and _matches(folder, config):
        log.info("reusing the Llama LM checkpoint in %s", folder)
        return folder
    t0 = time.perf_counter()
    torch.manual_seed(config.seed)  # parameter initialisation inside transformers draws from the global RNG
    rng = np.random.default_rng(config.seed)
    train, _ = split_corpus(config.heldout_every)
    tok = build_word_tokenizer(list(train.values()), config.vocab_size)
    words = filler_words("train", config.heldout_every)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=config.n_embd,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.n_layer,
        num_attention_heads=config.n_head,
        num_key_value_heads=config.n_kv_head,
        head_dim=config.head_dim,
        max_position_embeddings=config.max_position_embeddings,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
        initializer_range=config.init_std,
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
        attention_bias=config.attention_bias,
    )
    model = LlamaForCausalLM(cfg)
    model.config._attn_implementation = "sdpa"  # training only; saved and loaded with eager attention
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay, betas=(0.9, 0.95))
    lr_warmup = max(1, config.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: min(1.0, (s + 1) / lr_warmup) * 0.5 * (1 + math.cos(math.pi * min(s, config.steps) / config.steps)),
    )
    losses, ans_losses = [], []
    for step in tqdm(range(config.steps), desc="llama-lm-train", disable=not progress, leave=False):
        L = _curriculum_len(config, step, rng)
        warming = step < config.warm * config.steps  # mostly repeated codes: the induction heads form
        ids, labels, amask = _task_batch(
            tok,
            rng,
            words,
            L,
            max(2, config.tokens_per_step // L),
            drill=0.0 if warming else config.drill_share,
            repeat=config.warm_repeat_share if warming else config.repeat_share,
        )
        logits = model(input_ids=ids).logits[:, :-1]  # (B, T-1, V)
        ce = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), reduction="none", ignore_index=-100
        ).view(labels.shape[0], -1)
        valid = labels[:, 1:] != -100
        am = amask[:, 1:]
        lm_loss = ce[valid].mean()
        ans_loss = ce[am].mean()
        loss = lm_loss + config.answer_weight * ans_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(lm_loss.detach()))
        ans_losses.append(float(ans_loss.detach()))
        if progress and step % 50 == 0:
            log.info("step %d  L=%d  lm loss %.3f  answer loss %.3f", step, L, losses[-1], ans_losses[-1])
    train_seconds = time.perf_counter() - t0
    model.eval()
    model.config._attn_implementation = "eager"
    ppl = heldout_perplexity(model, tok, config, seq_len=min(512, config.max_len), n_seq=16)
    acc = full_cache_accuracy(
        model, tok, n_tokens=config.eval_tokens, n_samples=config.eval_samples, seed=10_000 + config.seed
    )
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    tail = max(1, min(50, len(losses)))
    meta = {
        "config": dataclasses.asdict(config),
        "arch": "llama",
        "train_loss_last50": float(sum(losses[-tail:]) / tail),
        "answer_loss_last50": float(sum(ans_losses[-tail:]) / tail),
        "train_loss_first": losses[0],
        "heldout_ppl": ppl,
        "full_cache_accuracy": acc,
        "n_params": sum(p.numel() for p in model.parameters()),
        "train_seconds": train_seconds,
        "seconds": time.perf_counter() - t0,
    }
    (folder / "attsvm_lm.json").write_text(json.dumps(meta, indent=1))
    log.info("trained the Llama LM in %.0f s: held-out ppl %.1f, full-cache accuracy %s", train_seconds, ppl, acc)
    return folder


def load_llama_lm(folder: str | Path) -> tuple[Any, Any]:
    """Load a folder written by :func:`train_llama_lm`: ``(LlamaForCausalLM in eval mode, eager attention,
    tokenizer)``."""
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

    set_offline()
    folder = _folder(folder)
    meta = folder / "attsvm_lm.json"
    if not meta.is_file() or json.loads(meta.read_text()).get("arch") != "llama":
        raise FileNotFoundError(
            f"{str(folder)!r} is not an attsvm Llama LM checkpoint (no attsvm_lm.json with "
            "arch 'llama'); train one with attsvm.analysis.lm.train_llama_lm"
        )
    model = LlamaForCausalLM.from_pretrained(folder, attn_implementation="eager", local_files_only=True).eval()
    tok = PreTrainedTokenizerFast.from_pretrained(folder, local_files_only=True)
    return model, tok


def cache_kw(model: Any, cache: Any) -> dict[str, Any]:
    """The keyword that hands ``cache`` to ``model(...)``: ``cache`` from transformers 5.3 on, ``past_key_values``
    before (5.2.x, the kvpress range), where an unknown keyword would be silently ignored."""
    import inspect

    return {"cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values": cache}


def encode_query(tok: Any, context: str, question: str, answer_prefix: str) -> tuple[Any, Any]:
    """``(context_ids (1, n), question_ids (1, m))`` as kvpress's pipeline makes them without a chat template:
    ``bos + context`` and ``question + "\n" + answer_prefix``, no other special tokens."""
    for name, text in (("context", context), ("question", question), ("answer_prefix", answer_prefix)):
        if not isinstance(text, str):
            raise TypeError(f"{name} must be a str, got {type(text).__name__}")
    ctx = tok.encode(tok.bos_token + context, add_special_tokens=False, return_tensors="pt")
    q = tok.encode(question + "\n" + answer_prefix, add_special_tokens=False, return_tensors="pt")
    return ctx, q


def decode_answer(model: Any, tok: Any, cache: Any, question_ids: Any, n_seen: int, max_new_tokens: int) -> str:
    """Greedy answer after a prefilled ``cache`` that has seen ``n_seen`` context tokens (kvpress's
    ``generate_answer``): the question at positions ``n_seen, ...``, then one token at a time until ``</s>`` or
    ``max_new_tokens``; the decoded text without special tokens."""
    import torch

    max_new_tokens = check_positive_int(max_new_tokens, "max_new_tokens")
    n_seen = check_positive_int(n_seen, "n_seen", minimum=0)
    if not (
        isinstance(question_ids, torch.Tensor)
        and question_ids.dim() == 2
        and question_ids.shape[0] == 1
        and question_ids.shape[1] >= 1
        and not question_ids.dtype.is_floating_point
    ):
        raise TypeError(
            "question_ids must be a torch.Tensor of token ids of shape (1, m), m >= 1 (encode_query's), got "
            + (
                f"shape {tuple(question_ids.shape)} dtype {question_ids.dtype}"
                if isinstance(question_ids, torch.Tensor)
                else type(question_ids).__name__
            )
        )
    kw = cache_kw(model, cache)
    m = question_ids.shape[1]
    with torch.no_grad():
        out = model(
            input_ids=question_ids,
            position_ids=torch.arange(n_seen, n_seen + m).unsqueeze(0),
            use_cache=True,
            logits_to_keep=1,
            **kw,
        )
        new = [int(out.logits[0, -1].argmax())]
        p = n_seen + m
        while len(new) < max_new_tokens and new[-1] != tok.eos_token_id:
            out = model(input_ids=torch.tensor([[new[-1]]]), position_ids=torch.tensor([[p]]), use_cache=True, **kw)
            new.append(int(out.logits[0, -1].argmax()))
            p += 1
    return str(tok.decode(new, skip_special_tokens=True))


def generate_answer(
    model: Any, tok: Any, context: str, question: str, answer_prefix: str, max_new_tokens: int, *, cache: Any = None
) -> str:
    """Greedy answer the way kvpress's pipeline makes it (without a chat template): prefill ``<s> context`` into
    ``cache`` (a fresh ``DynamicCache`` when None) with the base model, then :func:`decode_answer`."""
    import torch
    from transformers import DynamicCache

    cache = DynamicCache() if cache is None else cache
    ctx, q = encode_query(tok, context, question, answer_prefix)
    with torch.no_grad():
        model.model(input_ids=ctx, use_cache=True, **cache_kw(model.model, cache))
    return decode_answer(model, tok, cache, q, ctx.shape[1], max_new_tokens)


def full_cache_accuracy(model: Any, tok: Any, *, n_tokens: int, n_samples: int, seed: int) -> dict[str, float]:
    """RULER string-match accuracy (in [0, 1]) per task of the model with the full cache, on held-out filler."""
    from .tasks import TASKS, make_rows, score_row

    acc = {}
    for task in TASKS:
        rows = make_rows(task, n_samples, n_tokens=n_tokens, seed=seed)
        scores = [
            score_row(generate_answer(model, tok, r.context, r.question, r.answer_prefix, r.max_new_tokens), r.answer)
            for r in rows.itertuples()
        ]
        acc[task] = float(sum(scores) / len(scores))
    return acc


def heldout_perplexity(model: Any, tok: Any, config: LlamaLMConfig, *, seq_len: int, n_seq: int) -> float:
    """Perplexity on consecutive windows of the held-out topics (pure pydoc text, no tasks)."""
    import torch

    n_seq = check_positive_int(n_seq, "n_seq")
    seq_len = check_positive_int(seq_len, "seq_len", minimum=2)
    if not isinstance(config, LlamaLMConfig):
        raise TypeError(f"config must be a LlamaLMConfig, got {type(config).__name__}")
    _, held = split_corpus(config.heldout_every)
    ids = _stream(tok, list(held.values()))
    n = min(n_seq, (len(ids) - 1) // seq_len)
    if n < 1:
        raise ValueError(f"held-out text has only {len(ids)} tokens; seq_len={seq_len} is too long")
    chunks = ids[: n * seq_len].view(n, seq_len)
    with torch.no_grad():
        loss = float(model(input_ids=chunks, labels=chunks).loss)
    return math.exp(loss)
