"""A ``--where`` row filter parsed by a real SQL parser (sqlglot) and checked against the table's
schema before any engine sees it.

The text a user typed is never spliced into a query: it is parsed into one expression of an
allowed shape (comparisons, ``IS [NOT] NULL``, ``[NOT] IN`` / ``BETWEEN`` / ``LIKE``, ``AND`` /
``OR`` / ``NOT``, arithmetic and scalar functions; no subquery, statement or aggregate), each column
is resolved to a real one (an unquoted name as DataFusion reads it: lower-cased), each literal
compared with a column must fit its type (``stars = 1e30`` on an integer column, ``stars = text``
between a number and a string are refused here, with the column named), and the predicate is then
rendered from the tree with every identifier quoted. The engine (DataFusion for ``delta:``, the
database for ``sql:``) evaluates what it renders, so SQL's NULL rules are the engine's own.
"""

from __future__ import annotations

import re

import pyarrow as pa

from finetune_assets.core.sources.base import SourceError

INT64_MAX = 2**63 - 1


def _allowed():
    # lazy, as every sqlglot import here: only a source with a row filter (--where) parses one
    from sqlglot import exp

    return (
        exp.Column,
        exp.Identifier,
        exp.Literal,
        exp.Boolean,
        exp.Null,
        exp.And,
        exp.Or,
        exp.Not,
        exp.Paren,
        exp.EQ,
        exp.NEQ,
        exp.LT,
        exp.LTE,
        exp.GT,
        exp.GTE,
        exp.Is,
        exp.In,
        exp.Between,
        exp.Like,
        exp.ILike,
        exp.Neg,
        exp.Add,
        exp.Sub,
        exp.Mul,
        exp.Div,
        exp.Mod,
        exp.Cast,
        exp.DataType,
        exp.Func,
    )


def _family(type_: pa.DataType) -> str:
    if pa.types.is_integer(type_):
        return "integer"
    if pa.types.is_floating(type_) or pa.types.is_decimal(type_):
        return "number"
    if (
        pa.types.is_string(type_)
        or pa.types.is_large_string(type_)
        or pa.types.is_string_view(type_)
    ):
        return "string"
    if pa.types.is_boolean(type_):
        return "boolean"
    if pa.types.is_temporal(type_):
        return "temporal"
    return str(type_)


def render_where(
    where: str, schema: pa.Schema | None, dialect: str | None = None
) -> tuple[str, set[str]]:
    """(the predicate rendered from its parse tree for ``dialect``, the columns it reads); a
    predicate that is not one allowed expression over the schema's columns is a SourceError.
    Without a schema (a database query's columns are the database's to resolve) only the shape
    is checked and names are kept as written.
    """
    import sqlglot  # lazy: see _allowed
    from sqlglot import exp

    problem = f"row filter (--where) {where!r}"
    try:
        tree = sqlglot.parse_one(where, read=dialect)
    except sqlglot.errors.ParseError as err:
        raise SourceError(f"{problem} is not a SQL predicate: {_first(err)}") from None
    allowed = _allowed()
    for node in tree.walk():
        if isinstance(node, exp.AggFunc) or not isinstance(node, allowed):
            raise SourceError(
                f"{problem}: {type(node).__name__.upper()} ({node.sql()[:60]!r}) is not allowed in "
                "a row filter (one predicate over the table's columns: no subquery, statement or "
                "aggregate)"
            )
    columns: set[str] = set()
    if schema is None:
        return tree.sql(dialect=dialect), {c.name for c in tree.find_all(exp.Column)}
    for column in list(tree.find_all(exp.Column)):
        name = _resolve(column, schema, problem)
        columns.add(name)
        column.replace(exp.column(exp.to_identifier(name, quoted=True)))
    for node in tree.walk():
        _check_types(node, schema, problem)
    return tree.sql(dialect=dialect), columns


def _resolve(column, schema: pa.Schema, problem: str) -> str:
    """A column's real name: a quoted one as written, an unquoted one lower-cased (DataFusion's
    and PostgreSQL's rule), or the one column that matches it ignoring case otherwise.
    """
    ident = column.this
    if column.table:
        raise SourceError(f"{problem}: {column.sql()!r}: name columns without a table prefix")
    name = ident.name
    if name in schema.names and (ident.quoted or name == name.lower()):
        return name
    if not ident.quoted and name.lower() in schema.names:
        return name.lower()
    raise SourceError(
        f"{problem}: no column {column.sql()!r} in the table (columns: {', '.join(schema.names)};"
        ' quote a mixed-case name: "Name")'
    )


def _check_types(node, schema: pa.Schema, problem: str) -> None:
    from sqlglot import exp  # lazy: see _allowed

    if isinstance(node, (exp.EQ, exp.NEQ, exp.LT, exp.LTE, exp.GT, exp.GTE)):
        _compatible(node.this, node.expression, schema, problem, node)
    elif isinstance(node, exp.In):
        for value in node.expressions:
            _compatible(node.this, value, schema, problem, node)
    elif isinstance(node, exp.Between):
        for bound in (node.args.get("low"), node.args.get("high")):
            _compatible(node.this, bound, schema, problem, node)
    elif isinstance(node, (exp.Like, exp.ILike)):
        column = _column_type(node.this, schema)
        if column is not None and _family(column[1]) != "string":
            raise SourceError(
                f"{problem}: LIKE on {column[0]!r}, a {column[1]} column (LIKE matches text)"
            )
        pattern = _literal(node.expression)
        if pattern is not ... and pattern is not None and not isinstance(pattern, str):
            raise SourceError(
                f"{problem}: {node.sql()!r}: the LIKE pattern {node.expression.sql()} is not a "
                "string value"
            )


def _column_type(node, schema: pa.Schema) -> tuple[str, pa.DataType] | None:
    from sqlglot import exp  # lazy: see _allowed

    if isinstance(node, exp.Paren):
        return _column_type(node.this, schema)
    if isinstance(node, exp.Column):
        return node.name, schema.field(node.name).type
    return None


def _literal(node):
    """A literal's Python value (numbers signed), or ``...`` for anything else."""
    from sqlglot import exp  # lazy: see _allowed

    if isinstance(node, exp.Paren):
        return _literal(node.this)
    if isinstance(node, exp.Neg):
        value = _literal(node.this)
        return -value if isinstance(value, (int, float)) and not isinstance(value, bool) else ...
    if isinstance(node, exp.Boolean):
        return node.this
    if isinstance(node, exp.Null):
        return None
    if isinstance(node, exp.Literal):
        if node.is_string:
            return node.this
        text = node.this
        return float(text) if any(c in text for c in ".eE") else int(text)
    return ...


def _compatible(left, right, schema: pa.Schema, problem: str, node) -> None:
    """A column compared with a literal or another column: the types must meet."""
    lcol, rcol = _column_type(left, schema), _column_type(right, schema)
    if lcol and rcol:
        lf, rf = _family(lcol[1]), _family(rcol[1])
        numeric = {"integer", "number"}
        if lf != rf and not (lf in numeric and rf in numeric):
            raise SourceError(
                f"{problem}: {node.sql()!r} compares {lcol[0]!r} ({lcol[1]}) with {rcol[0]!r} "
                f"({rcol[1]}): their types differ (cast one, e.g. CAST({rcol[0]} AS VARCHAR))"
            )
        return
    column, other = (lcol, right) if lcol else (rcol, left)
    if column is None:
        return
    value = _literal(other)
    if value is ... or value is None:
        return
    name, type_ = column
    family = _family(type_)
    bad = None
    if isinstance(value, bool):
        bad = family != "boolean"
    elif isinstance(value, (int, float)):
        if family not in ("integer", "number"):
            bad = True
        elif family == "integer" and not -INT64_MAX - 1 <= value <= INT64_MAX:
            raise SourceError(
                f"{problem}: {other.sql()} is outside the range of {name!r} ({type_}): no row can "
                "match it"
            )
    elif family != "string":
        try:
            pa.scalar(value).cast(type_)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            bad = True
    if bad:
        raise SourceError(
            f"{problem}: {node.sql()!r} compares {name!r} ({type_}) with {other.sql()}, "
            f"which is not a {family} value"
        )


def _first(err: Exception) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(err))
    return " ".join(text.split())[:200]
