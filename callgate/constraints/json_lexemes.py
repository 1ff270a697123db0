"""Regular expressions of the JSON lexemes the grammars bound: numbers and string formats.

Knows: which numbers the strict parsers hold (parsers/json_scan.py, qwen3_xml_values.py) and
the spelling of the `format`s `date`, `time`, `date-time` and `uuid`. Does not know:
schemas, grammars or formats of calls. The regexes use no look-around, so they read the same
in Python's `re`, in llguidance's Lark lexemes and in outlines-core's dialect (the regex
baseline, benchmarks/regex_baseline/).

    INTEGER, NUMBER                     # every integer / number the parsers hold, bounded
    FORMATS: dict[str, str]             # format name -> the texts of a value of that format
"""

from __future__ import annotations

# Numbers the strict parsers hold (parsers/json_scan.py, qwen3_xml_values.py): an integer
# within Python's int-parsing limit, a float that stays finite (unbounded, `1e999` or 400
# digits and `.0` overflow, and the parser refuses the call). A number has at most
# MAX_INTEGER_DIGITS before its point. One digit there (how `json.dumps` writes a float in
# exponent form) takes an exponent up to 307, or down to -999 (which reads as 0.0); more
# digits take an exponent of two digits. So the largest number is below 1e308 (a double
# reaches 1.8e308), and `json.dumps` of any double below 1e308 is written. Each bound costs
# DFA states in every place a number may stand (measured: 40 byte states, were 8).
MAX_INTEGER_DIGITS = 20  # 2**64 has 20 digits
INTEGER = f"-?(?:0|[1-9][0-9]{{0,{MAX_INTEGER_DIGITS - 1}}})"
_FRACTION = r"(?:\.[0-9]+)?"
_EXPONENT = r"(?:[eE](?:\+?(?:[0-9]{1,2}|[0-2][0-9]{2}|30[0-7])|-[0-9]{1,3}))?"
NUMBER = (
    f"-?(?:[0-9]{_FRACTION}{_EXPONENT}|[1-9][0-9]{{1,{MAX_INTEGER_DIGITS - 1}}}{_FRACTION}(?:[eE][+-]?[0-9]{{1,2}})?)"
)

FORMATS = {
    "date": r"[0-9]{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])",
    "time": r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]+)?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])",
    "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
}
FORMATS["date-time"] = FORMATS["date"] + "[Tt]" + FORMATS["time"]
