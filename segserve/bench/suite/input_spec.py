"""A suite's `inputs:` (and a phase's, an archive target's): what the load sends, as files, generated photos, raw
tensors, JSON or multipart bodies."""

from typing import Annotated, Literal

from pydantic import Field, model_validator

from segserve.bench.suite.strict_model import Strict


class RawInput(Strict):
    """Raw tensors as the seed's clients sent them: synthetic images, normalised, in this dtype and shape."""

    dtype: Literal["float16", "float32", "bfloat16"] = "float16"
    """Element type of the tensor body"""
    shape: tuple[Literal[3], Annotated[int, Field(ge=1)], Annotated[int, Field(ge=1)]] = (3, 256, 448)
    """[channels, height, width]: must match the seg handler's input size"""
    count: Annotated[int, Field(ge=1)] = 4
    """Distinct bodies, sent round-robin"""
    seed: int = 7_000_000
    """First synthetic image's seed (images are a pure function of their seed)"""


class SyntheticPhotos(Strict):
    """JPEG photos made by the synthetic generator at this size (e.g. 1080×1920 for a phase of large photos)."""

    height: Annotated[int, Field(ge=8, le=8192)] = 1080
    """Pixels"""
    width: Annotated[int, Field(ge=8, le=8192)] = 1920
    """Pixels"""
    count: Annotated[int, Field(ge=1)] = 4
    """Distinct photos, sent round-robin"""
    quality: Annotated[int, Field(ge=1, le=100)] = 90
    """JPEG quality they are encoded at"""
    seed: int = 8_000_000
    """First photo's seed"""


class TensorInput(Strict):
    """A raw tensor body of any element type and shape, random values from a seed (a model that takes tensors)."""

    dtype: Literal["float16", "float32", "bfloat16", "int64", "int32", "uint8"] = "float32"
    """Element type"""
    shape: Annotated[list[Annotated[int, Field(ge=1)]], Field(min_length=1)]
    """Dimensions, e.g. [3, 256, 448]"""
    count: Annotated[int, Field(ge=1)] = 4
    """Distinct bodies, sent round-robin"""
    seed: int = 0
    """Seed of the first body (body i: seed + i); integers are drawn in [0, 100)"""


class JsonTemplate(Strict):
    """JSON bodies from a template: `{index}` in any string of it becomes the body's number (0, 1, …)."""

    template: dict | list | str
    """The JSON value sent, with {index} replaced in its strings"""
    count: Annotated[int, Field(ge=1)] = 1
    """Distinct bodies, sent round-robin"""


class Part(Strict):
    """One named part of a multipart/form-data request: TorchServe hands it to the handler under its name."""

    name: Annotated[str, Field(min_length=1)]
    """The part's name (the key the handler reads)"""
    file: str | None = None
    """A file's bytes"""
    text: str | None = None
    """A string (UTF-8)"""
    tensor: TensorInput | None = None
    """A raw tensor (its count is ignored: one per part)"""

    @model_validator(mode="after")
    def one_kind(self):
        if sum(kind is not None for kind in (self.file, self.text, self.tensor)) != 1:
            raise ValueError(f"part {self.name!r}: give exactly one of 'file', 'text' or 'tensor'")
        return self


class InputSpec(Strict):
    images: list[str] | None = None
    """Image files or globs (JPEG, PNG), relative to the working directory"""
    files: list[str] | None = None
    """Any files or globs, each sent as it is (application/octet-stream)"""
    raw: RawInput | None = None
    """Raw tensor bodies (synthetic images, normalised)"""
    tensor: TensorInput | None = None
    """Raw tensor bodies of any shape and type"""
    json_template: JsonTemplate | None = None
    """JSON bodies (application/json) from a template"""
    multipart: Annotated[list[Part], Field(min_length=1)] | None = None
    """Several named parts in one multipart/form-data request (a model with several inputs: tokens and mask)"""
    synthetic: SyntheticPhotos | None = None
    """JPEG photos from the synthetic generator"""

    @model_validator(mode="after")
    def one_kind(self):
        kinds = (self.images, self.files, self.raw, self.tensor, self.json_template, self.multipart, self.synthetic)
        if sum(kind is not None for kind in kinds) != 1:
            raise ValueError("give exactly one of 'images', 'files', 'raw', 'tensor', 'json_template', 'multipart' or 'synthetic'")
        if self.multipart is not None:
            names = [part.name for part in self.multipart]
            if len(set(names)) != len(names):
                raise ValueError(f"multipart: a part name is given twice (got {names})")
        return self

    @property
    def patterns(self) -> list[str]:
        """The file names and globs it reads (checked before anything starts)."""
        return [*(self.images or []), *(self.files or []), *(part.file for part in self.multipart or [] if part.file)]
