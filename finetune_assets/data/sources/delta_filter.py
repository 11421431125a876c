"""A ``--where`` row filter (the SQL predicate a ``delta:`` version records) as an Arrow
expression, so that the streamed Parquet reader (:mod:`.delta`) filters each batch itself.

Only a plain subset of SQL is translated: comparisons of a column with a literal or another
column (``= <> != < <= > >=``), ``IS [NOT] NULL``, ``[NOT] IN (...)``, ``[NOT] BETWEEN``,
``[NOT] LIKE``, ``AND`` / ``OR`` / ``NOT`` and parentheses; columns by their exact name (bare or
``"quoted"``); a literal compared with a column is cast to that column's type (``day >=
'2024-01-01'`` on a date column), as DataFusion coerces it. Anything else (a function call, an
unknown column, a literal that does not cast) translates to None and the reader hands the whole
predicate to delta-rs' DataFusion engine unchanged, so a version's filter means the same rows
whichever reader runs it. Rows where the predicate is NULL are dropped, as SQL's WHERE does.
"""

from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.compute as pc

_TOKEN = re.compile(
    r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<qid>\"(?:[^\"]|\"\")+\")"
    r"|(?P<num>-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)|(?P<op><>|!=|<=|>=|=|<|>|\(|\)|,)"
    r"|(?P<word>[A-Za-z_][A-Za-z0-9_]*))"
)
_KEYWORDS = {"AND", "OR", "NOT", "IS", "NULL", "IN", "BETWEEN", "LIKE", "TRUE", "FALSE"}
_COMPARE = {
    "=": pc.equal,
    "<>": pc.not_equal,
    "!=": pc.not_equal,
    "<": pc.less,
    "<=": pc.less_equal,
    ">": pc.greater,
    ">=": pc.greater_equal,
}


class _Untranslatable(Exception):
    """The predicate is outside the subset: DataFusion evaluates it instead."""


class _Column:
    def __init__(self, name: str, type_: pa.DataType):
        self.name, self.type = name, type_


def to_expression(sql: str, schema: pa.Schema) -> tuple[pc.Expression, set[str]] | None:
    """(the predicate as an Arrow expression, the columns it reads), or None outside the subset."""
    try:
        parser = _Parser(_tokens(sql), schema)
        expr = parser.disjunction()
        if parser.peek() is not None:
            raise _Untranslatable
        return _operand(expr, None), parser.columns
    except (_Untranslatable, pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None


def _tokens(sql: str) -> list[tuple[str, object]]:
    out, at = [], 0
    while sql[at:].strip():
        m = _TOKEN.match(sql, at)
        if not m:
            raise _Untranslatable
        at = m.end()
        kind = m.lastgroup
        text = m.group(kind)
        if kind == "str":
            out.append(("lit", text[1:-1].replace("''", "'")))
        elif kind == "num":
            out.append(("lit", float(text) if any(c in text for c in ".eE") else int(text)))
        elif kind == "qid":
            out.append(("col", text[1:-1].replace('""', '"')))
        elif kind == "word" and text.upper() in _KEYWORDS:
            out.append(("kw", text.upper()))
        elif kind == "word":
            out.append(("col", text))
        else:
            out.append(("op", text))
    return out


class _Parser:
    """Recursive descent over the tokens: OR < AND < NOT < one predicate."""

    def __init__(self, tokens: list[tuple[str, object]], schema: pa.Schema):
        self.tokens, self.at, self.schema, self.columns = tokens, 0, schema, set()

    def peek(self) -> tuple[str, object] | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self, kind: str, value: object = None) -> bool:
        tok = self.peek()
        if tok is not None and tok[0] == kind and (value is None or tok[1] == value):
            self.at += 1
            return True
        return False

    def expect(self, kind: str, value: object = None) -> None:
        if not self.take(kind, value):
            raise _Untranslatable

    def disjunction(self):
        expr = self.conjunction()
        while self.take("kw", "OR"):
            expr = _operand(expr, None) | _operand(self.conjunction(), None)
        return expr

    def conjunction(self):
        expr = self.negation()
        while self.take("kw", "AND"):
            expr = _operand(expr, None) & _operand(self.negation(), None)
        return expr

    def negation(self):
        if self.take("kw", "NOT"):
            return ~_operand(self.negation(), None)
        return self.predicate()

    def predicate(self):
        left = self.operand()
        tok = self.peek()
        if tok is not None and tok[0] == "op" and tok[1] in _COMPARE:
            self.at += 1
            right = self.operand()
            return _COMPARE[tok[1]](_operand(left, right), _operand(right, left))
        if self.take("kw", "IS"):
            negate = self.take("kw", "NOT")
            self.expect("kw", "NULL")
            test = _operand(left, None).is_null()
            return ~test if negate else test
        negate = self.take("kw", "NOT")
        if self.take("kw", "IN"):
            self.expect("op", "(")
            values = [self.literal()]
            while self.take("op", ","):
                values.append(self.literal())
            self.expect("op", ")")
            if None in values:
                raise _Untranslatable  # SQL's three-valued IN with a NULL: left to DataFusion
            values, column = pa.array(values), _operand(left, None)
            test = column.isin(values.cast(_type(left) or values.type))
            if negate:  # NULL NOT IN (...) is NULL in SQL (dropped), not true
                return ~test & column.is_valid()
        elif self.take("kw", "BETWEEN"):
            low = self.operand()
            self.expect("kw", "AND")
            high = self.operand()
            test = pc.greater_equal(_operand(left, low), _operand(low, left)) & pc.less_equal(
                _operand(left, high), _operand(high, left)
            )
        elif self.take("kw", "LIKE"):
            pattern = self.literal()
            if not isinstance(pattern, str):
                raise _Untranslatable
            test = pc.match_like(_operand(left, None), pattern)
        elif negate:
            raise _Untranslatable
        else:  # a bare boolean column or literal
            return left
        return ~test if negate else test

    def operand(self):
        if self.take("op", "("):
            expr = self.disjunction()
            self.expect("op", ")")
            return expr
        tok = self.peek()
        if tok is not None and tok[0] == "col":
            self.at += 1
            name = str(tok[1])
            if name not in self.schema.names:
                raise _Untranslatable  # DataFusion says which column is missing (or matches case)
            self.columns.add(name)
            return _Column(name, self.schema.field(name).type)
        return ("lit", self.literal())

    def literal(self):
        tok = self.peek()
        if tok is not None and tok[0] == "lit":
            self.at += 1
            return tok[1]
        if tok is not None and tok[0] == "kw" and tok[1] in ("TRUE", "FALSE", "NULL"):
            self.at += 1
            return {"TRUE": True, "FALSE": False, "NULL": None}[tok[1]]
        raise _Untranslatable


def _type(node) -> pa.DataType | None:
    return node.type if isinstance(node, _Column) else None


def _operand(node, other) -> pc.Expression:
    """A parsed node as an expression; a literal takes the type of the column it is compared
    with.
    """
    if isinstance(node, _Column):
        return pc.field(node.name)
    if isinstance(node, tuple) and node[0] == "lit":
        target = _type(other)
        value = node[1]
        if value is None:
            # "= NULL" is never true in SQL: leave such oddities to DataFusion
            raise _Untranslatable
        scalar = pa.scalar(value)
        return pc.scalar(scalar.cast(target) if target is not None else scalar)
    return node
