"""Names that become paths (a .war node's url, an S3 key, an archive name) stay inside their folder."""

import pytest

from segserve.archives.archive_urls import safe_relative_name
from segserve.errors import UsageError


@pytest.mark.parametrize("name", ["seg.mar", "nodes/seg.mar", "a..b.mar", "./seg.mar"])
def test_a_relative_name_is_kept(name):
    assert safe_relative_name(name, "models.seg.url") == name


@pytest.mark.parametrize("name", ["../seg.mar", "nodes/../../seg.mar", "/etc/passwd", "..", ""])
def test_an_absolute_or_climbing_name_is_refused_naming_the_field(name):
    with pytest.raises(UsageError, match=r"^models\.seg\.url: .*no absolute path, no '\.\.'"):
        safe_relative_name(name, "models.seg.url")
