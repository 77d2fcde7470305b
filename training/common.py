"""What the training steps share: the pair's shapes, the corpus, the
tokenizer, building the mlx-lm target with the chunked GDN, and a forward that
returns the drafter's tap hidden states.

Everything is MLX, so the same code runs on the CPU here (smoke runs, tests)
and on the H200 through MLX's CUDA wheel.
"""

import hashlib
import json
import os
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from make_fixtures import SPECIAL_TOKENS, write_tokenizer  # noqa: E402

from gdn_chunked import chunked_gated_delta  # noqa: E402

MASK_TOKEN = "<|mask|>"
EOS_TOKEN = "<|im_end|>"
ENDOFTEXT = "<|endoftext|>"

# The target: Qwen3.5 architecture, hybrid (GDN layers with full attention
# every third layer), ~14 M parameters, tied embeddings so the pair stays
# under 40 MB in bf16.
TARGET_TEXT = {
    "hidden_size": 384,
    "intermediate_size": 1152,
    "num_hidden_layers": 6,
    "num_attention_heads": 6,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "linear_num_value_heads": 8,
    "linear_num_key_heads": 4,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "linear_conv_kernel_dim": 4,
    "full_attention_interval": 3,
    "vocab_size": 4096,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [11, 11, 10],
    },
}
# The drafter: z-lab's DFlash format, block 16, taps spread over the target.
TAP_LAYERS = [0, 2, 4]
BLOCK_SIZE = 16
DRAFTER = {
    "architectures": ["DFlashDraftModel"],
    "model_type": "qwen3",
    "hidden_size": 384,
    "num_hidden_layers": 2,
    "num_attention_heads": 6,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "intermediate_size": 1152,
    "vocab_size": 4096,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 4096,
    "block_size": BLOCK_SIZE,
    "num_target_layers": 6,
}

# Python packages whose sources and docstrings make the corpus, with their
# licences (all permissive). Files are read from the Python that runs the
# script (on the H200: the image's torch venv).
CORPUS_PACKAGES = {
    "numpy": "BSD-3-Clause", "scipy": "BSD-3-Clause", "pandas": "BSD-3-Clause",
    "sympy": "BSD-3-Clause", "networkx": "BSD-3-Clause", "sklearn": "BSD-3-Clause",
    "statsmodels": "BSD-3-Clause", "requests": "Apache-2.0", "rich": "MIT",
    "click": "BSD-3-Clause", "jinja2": "BSD-3-Clause", "werkzeug": "BSD-3-Clause",
    "attr": "MIT", "yaml": "MIT", "packaging": "Apache-2.0 OR BSD-2-Clause",
    "torch": "BSD-3-Clause", "matplotlib": "Matplotlib (PSF-style)",
}


def hf_config() -> dict:
    text = dict(TARGET_TEXT, model_type="qwen3_5_text")
    return {
        "eos_token_id": SPECIAL_TOKENS.index(EOS_TOKEN),
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": text,
        "tie_word_embeddings": True,
    }


def drafter_config(tokenizer, layers: int = DRAFTER["num_hidden_layers"],
                   taps: list[int] = TAP_LAYERS) -> dict:
    """The drafter's config.json: DRAFTER's shape with `layers` decoder
    layers, tapping the target's layers `taps`."""
    return dict(DRAFTER, num_hidden_layers=layers, dflash_config={
        "target_layer_ids": list(taps),
        "mask_token_id": tokenizer.token_to_id(MASK_TOKEN),
    })


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def corpus_files(max_bytes: int) -> list[tuple[str, Path]]:
    """(package, file) for the .py files of the corpus packages, in a fixed
    order, skipping duplicates and huge generated files, up to max_bytes in
    all and an even share per package (so no one package dominates)."""
    import importlib.util

    files, seen, total = [], set(), 0
    share = 2 * max_bytes // len(CORPUS_PACKAGES)
    for package in sorted(CORPUS_PACKAGES):
        taken = 0
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            continue
        root = Path(list(spec.submodule_search_locations)[0])
        for path in sorted(root.rglob("*.py")):
            size = path.stat().st_size
            if not 200 <= size <= 200_000:
                continue
            digest = hashlib.sha1(path.read_bytes()).hexdigest()
            if digest in seen:
                continue
            seen.add(digest)
            files.append((package, path))
            total += size
            taken += size
            if total >= max_bytes:
                return files
            if taken >= share:
                break
    return files


def read_text(path: Path) -> str:
    return path.read_bytes().decode("utf-8", errors="replace")


def train_tokenizer(texts, vocab_size: int, out_dir: Path):
    """The fixtures' tokenizer recipe (Qwen's pre-tokenizer, special tokens
    and chat template) trained over `texts`."""
    return write_tokenizer(out_dir, texts, vocab_size, TARGET_TEXT["max_position_embeddings"])


def load_tokenizer(model_dir: Path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(model_dir / "tokenizer.json"))


def use_chunked_gdn():
    """Route mlx-lm's Qwen3.5 GDN layers through the chunked rule for
    multi-token calls (training, prefill); single steps keep mlx-lm's ops."""
    import mlx_lm.models.qwen3_5 as qwen
    from mlx_lm.models import gated_delta

    def update(q, k, v, a, b, A_log, dt_bias, state=None, mask=None, **kwargs):
        if q.shape[1] == 1 or mask is not None:
            return gated_delta.gated_delta_update(
                q, k, v, a, b, A_log, dt_bias, state, mask, use_kernel=False)
        beta = mx.sigmoid(b)
        log_g = -mx.exp(A_log.astype(mx.float32)) * nn.softplus(a + dt_bias)
        return chunked_gated_delta(q, k, v, None, beta, state, log_g=log_g)

    qwen.gated_delta_update = update


def build_target(config: dict | None = None):
    from mlx_lm.utils import _get_classes

    config = config or hf_config()
    model_class, args_class = _get_classes(config)
    return model_class(args_class.from_dict(config))


def load_target(model_dir: Path):
    from mlx_lm.utils import load_model

    model, _ = load_model(model_dir)
    return model


def forward_with_taps(model, tokens: mx.array, taps: list[int]):
    """Logits and the concatenated outputs of the tap layers (z-lab order)."""
    inner = model.language_model.model
    h = inner.embed_tokens(tokens)
    from mlx_lm.models.base import create_attention_mask

    fa_mask = create_attention_mask(h, None)
    captured = []
    for i, layer in enumerate(inner.layers):
        h = layer(h, mask=None if layer.is_linear else fa_mask, cache=None)
        if i in taps:
            captured.append(h)
    text = model.language_model
    head = inner.embed_tokens.as_linear if text.args.tie_word_embeddings else text.lm_head
    return head(inner.norm(h)), mx.concatenate(captured, axis=-1)


def seed_everything(seed: int):
    import random

    import numpy as np

    mx.random.seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)


def count_params(module: nn.Module) -> int:
    from mlx.utils import tree_flatten

    return sum(v.size for _, v in tree_flatten(module.parameters()))


def wait_for_peers(folder: Path, name: str, count: int, timeout: float = 180.0) -> bool:
    """Mark `name` as ready in `folder` and wait until `count` trainers have
    (or `timeout` seconds): trainers side by side on one GPU time their steps
    together, so each plans for the speed it will share. False on timeout."""
    import time

    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).touch()
    give_up = time.time() + timeout
    while sum(1 for _ in folder.iterdir()) < count:
        if time.time() > give_up:
            return False
        time.sleep(0.05)
    return True


def plan_steps(run_step, budget_seconds: float, cap: int = 100_000, margin: float = 0.9,
               before_timing=None) -> int:
    """How many training steps fit the budget: a few steps to compile and
    warm up, then the mean of ten timed ones. Only `margin` of the time
    left is planned: the real trainer compiles again and both evaluations
    run inside the budget (on an H100 the plan of 3,270 steps at the full
    budget was cut at 3,082). `before_timing` runs between the two (a wait
    for trainers side by side: one that timed its steps while the others
    still compiled planned 10,277 steps at 28.3 ms, ran at 43 ms and was
    cut at 8,034)."""
    import time

    began = time.time()
    for _ in range(3):
        run_step()
    print(f"3 warm-up steps (compiling) in {time.time() - began:.1f} s", flush=True)
    if before_timing is not None:
        before_timing()
    start = time.time()
    for _ in range(10):
        run_step()
    per_step = max((time.time() - start) / 10, 1e-9)  # a clock too coarse to see the steps
    budget_seconds -= time.time() - began  # the probe's own time is spent
    steps = int(max(10, min(cap, margin * budget_seconds / per_step)))
    print(f"{per_step * 1e3:.1f} ms a step: planning {steps} steps", flush=True)
    return steps


def write_token_stream(tokenizer, path: Path, max_bytes: float):
    """The corpus packages of this Python, tokenized: prompts for the
    self-distillation when step 1 ran on another machine."""
    import numpy as np

    eot = tokenizer.token_to_id(ENDOFTEXT)
    ids = []
    for encoding in tokenizer.encode_batch([read_text(p) for _, p in corpus_files(int(max_bytes))]):
        ids.extend(encoding.ids + [eot])
    stream = np.asarray(ids, dtype=np.int32)
    np.savez(path, train=stream, valid=stream[:0])


# Lines that open what people ask a code model to continue: a definition, a
# loop or branch, a docstring, a comment (bench/acceptance.py's prompts end
# on such lines).
OPENERS = ("def ", "async def ", "class ", "for ", "while ", "if ", "with ", "try:", '"""', "'''", "#")


def line_end_windows(stream, tokenizer, prompt: int):
    """End positions (exclusive) in `stream` of `prompt`-token windows that
    end right after a line opening a block (`OPENERS`, after its
    indentation): the token holding that line's newline is the window's
    last (byte-level BPE may join the next line's indentation to it). Such
    windows read like the prompts people write ("def fib(n):\\n"), where
    random ones mostly end mid-line."""
    import numpy as np

    texts = [tokenizer.decode([i], skip_special_tokens=False) for i in range(tokenizer.get_vocab_size())]
    ends, line = [], ""
    for at, token in enumerate(stream.tolist()):
        text = texts[token]
        if "\n" not in text:
            line += text
            continue
        head, _, tail = text.rpartition("\n")
        line += head.split("\n", 1)[0]
        if at + 1 >= prompt and line.lstrip().startswith(OPENERS):
            ends.append(at + 1)
        line = tail
    return np.asarray(ends, dtype=np.int64)


def prose_windows(stream, tokenizer, prompt: int):
    """End positions (exclusive) in `stream` of `prompt`-token windows that
    end inside prose: after a whole word of a docstring (inside triple
    quotes) or of a `#` comment, or after a newline inside a docstring. Such
    windows read like the prose prompts of bench/acceptance.py
    (`    \"\"\"Return the`, `# This function computes`, a `Parameters`
    header), which random windows, mostly code, and line-end windows
    rarely are."""
    import numpy as np

    texts = [tokenizer.decode([i], skip_special_tokens=False) for i in range(tokenizer.get_vocab_size())]
    ends, line = [], ""
    doc = ""  # the quote character of the open docstring, "" outside one
    quote, run = "", 0  # the quote character of the current run of quotes, and its length
    tokens = stream.tolist()
    for at, token in enumerate(tokens):
        text = texts[token]
        if '"' in text or "'" in text:
            for ch in text:
                if ch in "\"'":
                    run = run + 1 if ch == quote else 1
                    quote = ch
                    if run == 3 and doc in ("", ch):  # a triple quote opens or closes a docstring
                        doc, run = ("" if doc else ch), 0
                else:
                    quote, run = "", 0
        elif text:
            quote, run = "", 0
        in_doc = doc != ""
        if "\n" in text:
            line = text.rpartition("\n")[2]
            ended = in_doc
        else:
            line += text
            comment = not in_doc and "#" in line
            words = line.split("#", 1)[1].split() if comment else line.split()
            following = texts[tokens[at + 1]] if at + 1 < len(tokens) else " "
            # after a whole word: the next token does not go on with it
            ended = ((in_doc or comment) and len(words) >= 1 and text[-1:].isalpha()
                     and not following[:1].isalnum())
        if ended and at + 1 >= prompt:
            ends.append(at + 1)
    return np.asarray(ends, dtype=np.int64)
