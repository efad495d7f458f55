"""Template and field names are matched whole: a trailing newline is not part of a valid name.

``NAME_PATTERN.match`` with a ``$``-anchored pattern accepted ``"trial\\n"``
(``$`` matches before a final newline); ``fullmatch`` does not.
"""

from __future__ import annotations

import pytest

from shoal.errors import InvalidInput
from shoal_extract.templates import DOI_PATTERN, NAME_PATTERN, parse_template


def template(name: str = "trial", field_name: str = "title") -> dict[str, object]:
    return {
        "name": name,
        "fields": [{"name": field_name, "type": "string", "description": "the title"}],
    }


def test_a_template_name_with_a_trailing_newline_is_refused() -> None:
    assert parse_template(template()).name == "trial"
    with pytest.raises(InvalidInput) as caught:
        parse_template(template(name="trial\n"))
    assert caught.value.field == "template.name"


def test_a_field_name_with_a_trailing_newline_is_refused() -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_template(template(field_name="title\n"))
    assert caught.value.field == "template.fields[0].name"


def test_the_patterns_match_whole_values_only() -> None:
    assert NAME_PATTERN.fullmatch("trial") and not NAME_PATTERN.fullmatch("trial\n")
    assert DOI_PATTERN.fullmatch("10.1234/abc") and not DOI_PATTERN.fullmatch("10.1234/abc\n")
