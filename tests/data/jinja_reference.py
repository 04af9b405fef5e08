#!/usr/bin/env python3
"""Reference renderings for tests/server_jinja_*_test.cpp.

Reads a JSON list of {"template": str, "context": obj} from argv[1] and writes a JSON list of
{"ok": rendered} or {"error": message} to argv[2]. The environment is the one Hugging Face's
apply_chat_template uses (trim_blocks, lstrip_blocks, a tojson that keeps key order and non-ASCII
text, raise_exception), since that is what chat templates are written against.
"""
import json
import sys

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception

with open(sys.argv[1], encoding="utf-8") as f:
    cases = json.load(f)
out = []
for c in cases:
    try:
        out.append({"ok": env.from_string(c["template"]).render(**c["context"])})
    except Exception as e:  # noqa: BLE001 - any failure is a result the C++ side compares against
        out.append({"error": f"{type(e).__name__}: {e}"})
with open(sys.argv[2], "w", encoding="utf-8") as f:
    json.dump(out, f, ensure_ascii=False)
