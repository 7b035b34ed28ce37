"""Writes runtime/tests/fixtures/tokenizer/parity.json: token ids and type ids from the Python
`tokenizers` package for the committed all-MiniLM-L6-v2 tokenizer.json, with the file's own
`padding: Fixed(128)` turned off and truncation set per case (longest-first, as HF
`truncation=True`), for runtime/tests/data.rs to compare the Rust `tokenizers` crate against.

Run from the repository root with the conformance venv (tokenizers 0.23.x):
    conformance/.venv/bin/python runtime/reference/make_tokenizer_fixtures.py
"""

import json
import pathlib

import tokenizers
from tokenizers import Tokenizer

HERE = pathlib.Path(__file__).resolve().parent.parent / "tests/fixtures/tokenizer"
LONG = ("This message is long enough to be truncated: " + "lorem ipsum dolor sit amet " * 40).strip()

# (text, text_pair or None, max_len)
CASES = [
    ("Hello, world!", None, 128),
    ("hello world", None, 128),
    ("", None, 128),
    ("   ", None, 128),
    ("Café naïve résumé façade Ångström", None, 128),
    ("Größe straße über Ölfeld", None, 128),
    ("東京は日本の首都です。", None, 128),
    ("中文测试：机器学习很有趣", None, 128),
    ("한국어 문장도 있습니다", None, 128),
    ("Emoji 😀🎉 and symbols ©®™ €100", None, 128),
    ("FREE!!! Click http://example.com/win?id=123&x=y NOW $$$", None, 128),
    ("Tokenization of unbelievably-hyphenated, CamelCaseWords and numbers 3.14159 1,000,000", None, 128),
    ("tabs\tand\nnewlines\r\nmixed", None, 128),
    (LONG, None, 32),
    (LONG, None, 128),
    ("short question?", "A much longer answer that goes on and on " * 10, 24),
    ("What is the capital of France?", "Paris is the capital of France.", 128),
    ("premise: the cat sat on the mat", "hypothesis: a cat is sitting", 16),
    (LONG, LONG + " again", 40),
    ("é", "中", 128),
    ("RE: USA USA WE ARE NUMBER ....six. . On Wed, 2002-07-24 at 14:45, Jim Whitehead wrote:", None, 128),
    ("x" * 300, None, 64),
]


def main():
    tok = Tokenizer.from_file(str(HERE / "tokenizer.json"))
    tok.no_padding()
    out = []
    for text, pair, max_len in CASES:
        tok.enable_truncation(max_len)
        enc = tok.encode(text, pair) if pair is not None else tok.encode(text)
        out.append({"text": text, "text_pair": pair, "max_len": max_len,
                    "ids": enc.ids, "type_ids": enc.type_ids})
    doc = {"tokenizers": tokenizers.__version__, "cases": out}
    (HERE / "parity.json").write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n")
    print(f"{len(out)} cases -> {HERE / 'parity.json'}")


if __name__ == "__main__":
    main()
