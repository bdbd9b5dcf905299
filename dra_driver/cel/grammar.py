"""The parser: cel-python's lark grammar, extended with the syntax the scheduler accepts.

cel-python's grammar lacks CEL's optional syntax (``a.?b``, ``a[?k]``, ``[?x]``, ``{?k: v}``),
backtick-quoted field names (``a.`cuda-version` ``) and trailing commas in list and map
literals. The grammar text is patched when the parser is first built; a patch that no longer
applies to a new cel-python release fails loudly instead of parsing differently.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import celpy
from lark import Lark, Token

_PATCHES = [
    (
        "member         : member_dot | member_dot_arg | member_index | member_object | primary",
        "member         : member_dot | member_dot_arg | member_index | member_object | primary\n"
        "               | member_opt_dot | member_opt_index\n"
        'member_opt_dot : member "." "?" (IDENT | QUOTED_IDENT)\n'
        'member_opt_index : member "[" "?" expr "]"',
    ),
    ('member_dot     : member "." IDENT', 'member_dot     : member "." (IDENT | QUOTED_IDENT)'),
    (
        'list_lit       : "[" [exprlist] "]"',
        'list_lit       : "[" [listitems] "]"\n'
        'listitems      : listitem ("," listitem)* [","]\n'
        "?listitem      : expr | opt_item\n"
        'opt_item       : "?" expr',
    ),
    (
        'mapinits       : expr ":" expr ("," expr ":" expr)*',
        'mapinits       : mapkey ":" expr ("," mapkey ":" expr)* [","]\n'
        "?mapkey        : expr | opt_item",
    ),
    (
        "IDENT          : /[_a-zA-Z][_a-zA-Z0-9]*/",
        "IDENT          : /[_a-zA-Z][_a-zA-Z0-9]*/\nQUOTED_IDENT   : /`[_a-zA-Z0-9.\\-\\/ ]+`/",
    ),
]


def grammar() -> str:
    """cel-python's grammar with the patches applied."""
    text = (Path(celpy.__file__).parent / "cel.lark").read_text()
    for old, new in _PATCHES:
        if text.count(old) != 1:
            raise RuntimeError(f"cel-python's grammar changed; cannot apply: {old}")
        text = text.replace(old, new)
    return text


def _literal_keywords(token: Token) -> Token:
    # true/false lex as identifiers; make them literals, as cel-python's own parser does.
    if token.value in ("true", "false"):
        # With the identifier's position, for errors such as ".true" (a literal after a dot).
        return Token.new_borrow_pos("BOOL_LIT", token.value, token)
    return token


@lru_cache(maxsize=1)
def parser() -> Lark:
    """The LALR parser (built on first use: the tables take most of a second)."""
    return Lark(
        grammar(),
        parser="lalr",
        start="expr",
        g_regex_flags=re.M,
        lexer_callbacks={"IDENT": _literal_keywords},
        propagate_positions=True,
        maybe_placeholders=False,
        priority="invert",
    )
