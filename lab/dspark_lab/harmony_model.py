"""A tiny target whose greedy output crosses a harmony-style, multi-token channel marker.

The prompt opens the analysis channel (``<|channel|> analysis <|message|>``, three tokens, in the
prompt), then greedy decoding walks

    r001 ... r{R-1} <|end|> <|start|> assistant <|channel|> final <|message|> a000 ... a{A-1} <|eos|>

so reasoning ends on the last token of the three-token ``<|channel|>final<|message|>``, which
shares its first and last token with the analysis marker.  A bigram model cannot emit both
headers (``<|channel|>`` would need two successors), so the analysis header sits in the prompt;
the answer prompt ends inside the final channel instead.  The tokenizer decodes without spaces,
so ``--reasoning-parser openai_gptoss``'s marker strings resolve to these token sequences.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from dspark_lab.tiny_models import SPECIALS, VOCAB_SIZE, _write_model, build_cached

HARMONY_TOKENS = ("<|start|>", "<|end|>", "<|channel|>", "<|message|>", "<|return|>")
HARMONY_WORDS = ("user", "assistant", "analysis", "final", "commentary")


@dataclass(frozen=True)
class HarmonyScript:
    reasoning_len: int = 60
    answer_len: int = 40
    fuse_decoding = True
    added_tokens = HARMONY_TOKENS

    def words(self) -> list[str]:
        head = (
            SPECIALS + list(HARMONY_TOKENS) + list(HARMONY_WORDS)
            + [f"r{i:03d}" for i in range(self.reasoning_len)]
            + [f"a{i:03d}" for i in range(self.answer_len)]
        )
        if VOCAB_SIZE - len(head) < 8:
            raise ValueError("script too long for the tiny vocabulary")
        return head + [f"f{i:03d}" for i in range(VOCAB_SIZE - len(head))]

    def vocab(self) -> dict[str, int]:
        return {w: i for i, w in enumerate(self.words())}

    def ids(self, *words: str) -> list[int]:
        v = self.vocab()
        return [v[w] for w in words]

    def reasoning(self) -> list[str]:
        return [f"r{i:03d}" for i in range(self.reasoning_len)]

    def answer(self) -> list[str]:
        return [f"a{i:03d}" for i in range(self.answer_len)]

    FINAL_HEADER = ("<|end|>", "<|start|>", "assistant", "<|channel|>", "final", "<|message|>")

    def chain(self) -> list[str]:
        return self.reasoning() + list(self.FINAL_HEADER) + self.answer() + ["<|eos|>"]

    def successor(self) -> dict[int, int]:
        chain = self.ids(*self.chain())
        return dict(zip(chain, chain[1:]))

    def user_turn(self) -> list[int]:
        return self.ids("<|start|>", "user", "<|message|>", "f000", "f001", "f002", "<|end|>")

    def thinking_prompt(self) -> list[int]:
        """Ends one token into the analysis channel's text (its header is three tokens back)."""
        header = ("<|start|>", "assistant", "<|channel|>", "analysis", "<|message|>", "r000")
        return self.user_turn() + self.ids(*header)

    def answer_prompt(self) -> list[int]:
        header = ("<|start|>", "assistant", "<|channel|>", "final", "<|message|>", "a000")
        return self.user_turn() + self.ids(*header)

    def expected_output(self, thinking: bool = True) -> list[int]:
        chain = self.chain()
        start = 1 if thinking else chain.index("a000") + 1
        return self.ids(*chain[start:])

    def reasoning_tokens(self) -> int:
        """Output tokens up to and including the final header's ``<|message|>``."""
        return self.reasoning_len - 1 + len(self.FINAL_HEADER)


def build_harmony_target(script: HarmonyScript = HarmonyScript()) -> str:
    spec = {"script": asdict(script), "seed": 0, "layout": "harmony"}
    return str(build_cached("harmony-target", spec, script, lambda out: _write_model(out, script.successor(), seed=0)))
