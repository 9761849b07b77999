"""A strict reader of the Prometheus text exposition format (0.0.4), as
Prometheus' own parser and promtool check them: HELP/TYPE lines, metric and
label names, label value escapes, values, a family's samples together and
after its TYPE, histogram/summary suffixes, no series twice. Raises
ValueError naming the line otherwise. (No promtool or prometheus_client on
the test machines.)"""
import math
import re

METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}
SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}


def _value(text, where):
    if text in ("+Inf", "Inf"):
        return math.inf
    if text == "-Inf":
        return -math.inf
    if text == "NaN":
        return math.nan
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{where}: '{text}' is not a value") from None


def _labels(text, i, where):
    """Parses the labels from text[i] (just after '{'); returns (dict, index after '}')."""
    labels = {}
    while True:
        if text.startswith("}", i):
            return labels, i + 1
        m = LABEL_NAME.match(text, i)
        if not m or not text.startswith('="', m.end()):
            raise ValueError(f"{where}: bad label at '{text[i:]}'")
        name, i = m.group(), m.end() + 2
        value = []
        while True:
            if i >= len(text):
                raise ValueError(f"{where}: unterminated label value")
            c = text[i]
            if c == "\\":
                escaped = text[i + 1:i + 2]
                if escaped not in ("\\", '"', "n"):
                    raise ValueError(f"{where}: bad escape \\{escaped}")
                value.append("\n" if escaped == "n" else escaped)
                i += 2
            elif c == '"':
                i += 1
                break
            else:
                value.append(c)
                i += 1
        if name in labels:
            raise ValueError(f"{where}: label {name} twice")
        labels[name] = "".join(value)
        if text.startswith(",", i):
            i += 1
        elif not text.startswith("}", i):
            raise ValueError(f"{where}: expected ',' or '}}' at '{text[i:]}'")


def _family_of(name, families):
    for family, f in families.items():
        if name == family or any(name == family + s for s in SUFFIXES.get(f["type"], ())):
            return family
    return None


def parse(text):
    """{family: {"type", "help", "samples": [(name, labels, value)]}}."""
    families, seen, closed, current = {}, set(), set(), None
    for number, line in enumerate(text.split("\n"), 1):
        where = f"line {number}"
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                name = parts[2]
                if not METRIC_NAME.fullmatch(name):
                    raise ValueError(f"{where}: bad metric name {name}")
                f = families.setdefault(name, {"type": "untyped", "help": None,
                                               "samples": [], "typed": False})
                if f["samples"]:
                    raise ValueError(f"{where}: {parts[1]} of {name} after its samples")
                if parts[1] == "TYPE":
                    if f["typed"] or len(parts) != 4 or parts[3] not in TYPES:
                        raise ValueError(f"{where}: bad or second TYPE for {name}")
                    f["type"], f["typed"] = parts[3], True
                else:
                    if f["help"] is not None:
                        raise ValueError(f"{where}: second HELP for {name}")
                    f["help"] = parts[3] if len(parts) == 4 else ""
            continue
        m = METRIC_NAME.match(line)
        if not m:
            raise ValueError(f"{where}: no metric name in '{line}'")
        name, i, labels = m.group(), m.end(), {}
        if line.startswith("{", i):
            labels, i = _labels(line, i + 1, where)
        rest = line[i:].split()
        if not line[i:i + 1].isspace() or len(rest) not in (1, 2):
            raise ValueError(f"{where}: expected ' VALUE [TIMESTAMP]' in '{line}'")
        value = _value(rest[0], where)
        if len(rest) == 2 and not re.fullmatch(r"-?\d+", rest[1]):
            raise ValueError(f"{where}: bad timestamp {rest[1]}")
        family = _family_of(name, families) or name
        f = families.setdefault(family, {"type": "untyped", "help": None,
                                         "samples": [], "typed": False})
        if family != current:
            if family in closed:
                raise ValueError(f"{where}: samples of {family} are not together")
            if current is not None:
                closed.add(current)
            current = family
        if f["type"] == "histogram" and name == family + "_bucket" and "le" not in labels:
            raise ValueError(f"{where}: a histogram bucket without le")
        series = (name, tuple(sorted(labels.items())))
        if series in seen:
            raise ValueError(f"{where}: series {series} twice")
        seen.add(series)
        f["samples"].append((name, labels, value))
    for f in families.values():
        del f["typed"]
    return families
