"""The answer's text out of a model's streamed reply, as it is generated: what a streamed chat completion sends.

A run's tokens are its model's raw replies, every step's: with the JSON actions (the default), a tool call
is ``{"action": "tool", ...}`` and the answer ``{"action": "final_answer", "answer": "..."}``. A chat
client wants the answer only, as it is written. ``AnswerText`` reads each step's chunks; once a step's
text is seen to start as a final answer, it yields the answer string's characters (JSON escapes decoded)
as they come, and stops at its closing quote. A step that turns out to be anything else yields nothing;
so does a final answer that is not a string (a structured output's object), or one that puts ``answer``
before ``action``: the caller then sends the run's answer, from its outcome, at the end. With native tool
calling a step's text is already plain content and passes through as it is.
"""

from __future__ import annotations

import json

#: A final answer's opening, token by token (whitespace allowed between them), up to the answer's quote.
_OPENING = ("{", '"action"', ":", '"final_answer"', ",", '"answer"', ":", '"')
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


class _Step:
    """One step's reply: opening matched up to ``token``/``within``; then the string's decoding."""

    def __init__(self) -> None:
        self.buffer = ""
        self.cursor = 0  # how much of ``buffer`` has been consumed
        self.token = 0
        self.within = 0  # characters of the current opening token matched
        self.state = "opening"  # opening | answer | done | other

    def feed(self, text: str) -> str:
        self.buffer += text
        if self.state == "opening":
            self._open()
        if self.state == "answer":
            return self._decode()
        return ""

    def _open(self) -> None:
        buf = self.buffer
        while self.cursor < len(buf) and self.state == "opening":
            want = _OPENING[self.token]
            char = buf[self.cursor]
            if self.within == 0 and char.isspace():
                self.cursor += 1
                continue
            if char != want[self.within]:
                self.state = "other"
                return
            self.cursor += 1
            self.within += 1
            if self.within == len(want):
                self.token += 1
                self.within = 0
                if self.token == len(_OPENING):
                    self.state = "answer"

    def _decode(self) -> str:
        out: list[str] = []
        buf = self.buffer
        while self.cursor < len(buf):
            char = buf[self.cursor]
            if char == '"':
                self.state = "done"
                self.cursor += 1
                break
            if char != "\\":
                out.append(char)
                self.cursor += 1
                continue
            if self.cursor + 1 >= len(buf):
                break  # the escape's second character has not come yet
            kind = buf[self.cursor + 1]
            if kind in _ESCAPES:
                out.append(_ESCAPES[kind])
                self.cursor += 2
                continue
            if kind != "u":
                self.state = "other"  # not JSON: the outcome's answer will tell
                break
            size = 6
            if self.cursor + 6 > len(buf):
                break
            code = int(buf[self.cursor + 2:self.cursor + 6], 16) if _hex(buf[self.cursor + 2:self.cursor + 6]) else -1
            if code < 0:
                self.state = "other"
                break
            if 0xD800 <= code < 0xDC00:  # a surrogate pair: both halves first
                if self.cursor + 12 > len(buf):
                    break
                size = 12
            try:
                out.append(json.loads(f'"{buf[self.cursor:self.cursor + size]}"'))
            except ValueError:
                self.state = "other"
                break
            self.cursor += size
        return "".join(out)


def _hex(text: str) -> bool:
    return len(text) == 4 and all(c in "0123456789abcdefABCDEF" for c in text)


class AnswerText:
    """Feed it a run's token chunks (``feed(step_id, text)``); it returns the answer text they add."""

    def __init__(self, *, native: bool = False) -> None:
        self.native = native
        self.steps: dict[str, _Step] = {}
        self.sent = ""

    def feed(self, step_id: str, text: str) -> str:
        if self.native:
            piece = text
        else:
            step = self.steps.get(step_id)
            if step is None:
                step = self.steps[step_id] = _Step()
            piece = step.feed(text)
        self.sent += piece
        return piece

    def rest(self, answer: str | None) -> str:
        """What is left to send once the run's ``answer`` is known: all of it when nothing was streamed,
        the remainder when what was streamed begins it, else nothing (what was sent cannot be taken back)."""
        if not answer:
            return ""
        if answer.startswith(self.sent):
            return answer[len(self.sent):]
        return ""


__all__ = ["AnswerText"]
