"""The two ways a selector fails: it does not compile, or it fails while evaluating a device."""

from __future__ import annotations

from dra_driver.cel.types import type_name
from dra_driver.errors import DriverError


class CelError(DriverError):
    """Base class of every CEL error this package raises."""


class CompileError(CelError):
    """A selector that does not parse or refers to something the environment lacks.

    ``str()`` gives the position as ``<input>:line:column``, the message, the source line and a
    caret under the offending column, the way the API server reports CEL compile errors;
    line 0 means no position (errors found while building the program), only the message;
    line -1 is the parser's ``<input>:-1:0`` (limits it checks before or after parsing).
    """

    def __init__(self, expression: str, message: str, line: int, column: int) -> None:
        self.expression = expression
        self.message = message
        self.line = line
        self.column = column
        super().__init__(self.render())

    def render(self) -> str:
        """The full, multi-line error text."""
        if self.line == 0:
            return self.message
        if self.line < 0:
            return f"ERROR: <input>:-1:0: {self.message}"
        lines = self.expression.splitlines() or [""]
        source = lines[self.line - 1] if 0 < self.line <= len(lines) else lines[-1]
        caret = "." * max(self.column - 1, 0) + "^"
        return f"ERROR: <input>:{self.line}:{self.column}: {self.message}\n | {source}\n | {caret}"


class EvalError(CelError):
    """A runtime error: the scheduler treats it as an error of the allocation attempt."""


class Abort(EvalError):
    """An error that stops evaluation outright (the cost limit, an internal failure): unlike
    other errors, ``||``, ``&&`` and the quantifier macros do not absorb it."""


class NoSuchOverload(EvalError):
    """A function or operator was applied to argument types it does not accept."""

    def __init__(self, function: str, *args: object) -> None:
        types = ", ".join(type_name(a) for a in args)
        super().__init__(f"no such overload: {function}({types})")


class NoSuchKey(EvalError):
    """A map lookup of a key that is not there (e.g. a device without that attribute)."""

    def __init__(self, key: object, where: str = "") -> None:
        self.key = key
        self.where = where
        # The scheduler's words first (so searching for them finds its documentation), then
        # where the lookup was.
        text = (
            f"no such key: {key}. consider using CEL optional chaining (.? followed by "
            "orValue()) or guarding the check with has() for optional fields"
        )
        super().__init__(text + (f" (looked up in {where})" if where else ""))
