"""A tiny, valid llama-architecture GGUF for fast tests (random weights, byte-level BPE).

`make_tiny_gguf(path)` writes ~300 KB in well under a second. The vocabulary is GPT-2
style byte-level BPE (every byte is a token, plus a few merges), so any text round-trips
and multi-byte characters (emoji, CJK) span several tokens -- handy for UTF-8 tests.
Control tokens (<|endoftext|>, <|im_start|>, <|im_end|>) have all-zero output rows, so a
random model practically never emits them: generations run to max_tokens or a stop string.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

# A few merges so that some tokens are longer than one byte (stop strings then span tokens).
_MERGES = (
    ("Ġ", "t"),
    ("h", "e"),
    ("Ġt", "he"),
    ("i", "n"),
    ("e", "r"),
    ("a", "n"),
    ("o", "n"),
    ("Ġ", "a"),
    ("r", "e"),
    ("Ġ", "s"),
    ("l", "l"),
    ("o", "r"),
    ("e", "n"),
    ("a", "t"),
    ("Ġ", "w"),
    ("Ġ", "o"),
    ("i", "s"),
    ("Ġ", "c"),
    ("e", "s"),
    ("i", "t"),
)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character map."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


def tiny_vocab() -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges) of the tiny byte-level BPE vocabulary."""
    byte_map = _bytes_to_unicode()
    tokens = [byte_map[b] for b in range(256)]
    types = [1] * 256  # NORMAL
    merges = []
    for a, b in _MERGES:
        merges.append(f"{a} {b}")
        tokens.append(a + b)
        types.append(1)
    for special in SPECIAL_TOKENS:
        tokens.append(special)
        types.append(3)  # CONTROL
    return tokens, types, merges


def make_tiny_gguf(
    path: Path,
    *,
    n_layer: int = 2,
    n_embd: int = 64,
    n_head: int = 2,  # head dim 32: quantized KV (q8_0, q4_0) needs a multiple of 32
    n_head_kv: int = 1,
    n_ff: int = 128,
    n_ctx_train: int = 4096,
    seed: int = 1234,
    chat_template: str = CHATML_TEMPLATE,
) -> Path:
    """Write a tiny random llama GGUF with a ChatML template to `path`; return `path`."""
    import gguf  # imported here so that merely importing this module stays cheap

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tokens, types, merges = tiny_vocab()
    n_vocab = len(tokens)
    special_ids = {t: tokens.index(t) for t in SPECIAL_TOKENS}
    head_dim = n_embd // n_head

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-test-llama")
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(0)  # ALL_F32

    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(special_ids["<|endoftext|>"])
    w.add_eos_token_id(special_ids["<|im_end|>"])
    w.add_eot_token_id(special_ids["<|im_end|>"])
    w.add_pad_token_id(special_ids["<|endoftext|>"])
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)
    w.add_chat_template(chat_template)

    rng = np.random.default_rng(seed)

    def normal(*shape: int, scale: float) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    # numpy shape (rows, cols) becomes ggml ne = [cols, rows]
    w.add_tensor("token_embd.weight", normal(n_vocab, n_embd, scale=1.0))
    for i in range(n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(p + "attn_q.weight", normal(n_embd, n_embd, scale=n_embd**-0.5))
        w.add_tensor(p + "attn_k.weight", normal(n_head_kv * head_dim, n_embd, scale=n_embd**-0.5))
        w.add_tensor(p + "attn_v.weight", normal(n_head_kv * head_dim, n_embd, scale=n_embd**-0.5))
        w.add_tensor(p + "attn_output.weight", normal(n_embd, n_embd, scale=n_embd**-0.5))
        w.add_tensor(p + "ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(p + "ffn_gate.weight", normal(n_ff, n_embd, scale=n_embd**-0.5))
        w.add_tensor(p + "ffn_up.weight", normal(n_ff, n_embd, scale=n_embd**-0.5))
        w.add_tensor(p + "ffn_down.weight", normal(n_embd, n_ff, scale=n_ff**-0.5))
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    output = normal(n_vocab, n_embd, scale=0.5)
    output[list(special_ids.values())] = 0.0  # control tokens: logit 0, practically never chosen
    w.add_tensor("output.weight", output)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


if __name__ == "__main__":
    import sys

    print(make_tiny_gguf(Path(sys.argv[1] if len(sys.argv) > 1 else "tiny.gguf")))
