"""Tables and request models of what targets see after promotion.

Runtime reports from ``kcert.guard`` (``POST /v1/observations``), the
mismatches they carry with their evidence, latency (the guard's histograms
and samples ingested from traces, ``POST /v1/perf``) and each target's
runtime policy. The wire format is documented in the README ("After promotion");
every request model refuses unknown fields and bounds every size.
Imported by :mod:`kcert.registry.models`, so the tables share its metadata.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, Strict, StringConstraints, model_validator
from pydantic import Field as PydanticField
from sqlalchemy import JSON, BigInteger, Column, Index, LargeBinary
from sqlmodel import Field, SQLModel

from kcert.registry.models import (
    DIGEST_PATTERN,
    NAME_PATTERN,
    REQUEST_CONFIG,
    TEXT_PATTERN,
    _when,
)

#: Reports per request, and mismatches per report (the contract's bounds).
MAX_REPORTS = 100
MAX_MISMATCHES = 100
#: Arrays named per mismatch (inputs, outputs, reference, evidence each).
MAX_ARRAYS = 64
MAX_DIMS = 32
MAX_RANK = 8
#: Histogram buckets the registry keeps per report.
MAX_BUCKETS = 256
#: Latency samples per ``POST /v1/perf`` request.
MAX_PERF_SAMPLES = 100_000
_SAFE_INT = 2**53 - 1
#: dtypes evidence may hold: the spec's, under NumPy's names (bf16 travels as uint16 bits).
EVIDENCE_DTYPES = (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64",
)  # fmt: skip

Count = Annotated[int, Strict(), PydanticField(ge=0, le=_SAFE_INT)]
ArgName = Annotated[str, StringConstraints(min_length=1, max_length=128,
                                           pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]  # fmt: skip
Anchor = Annotated[str, StringConstraints(pattern=r"^sha256:[0-9a-f]{64}$")]
Finite = Annotated[float, PydanticField(ge=0, allow_inf_nan=False)]
#: An error metric: a number, or "nan"/"inf" where the kernel wrote NaN or Inf (JSON has none).
ErrorMetric = Finite | Literal["nan", "inf"]


def _utc(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise ValueError("times carry a zone (end them with Z)")
    return value


When = Annotated[datetime, AfterValidator(_utc)]


class EvidenceArray(BaseModel):
    model_config = REQUEST_CONFIG

    dtype: Literal[EVIDENCE_DTYPES]  # type: ignore[valid-type]
    shape: list[Annotated[int, Strict(), PydanticField(ge=0, le=_SAFE_INT)]] = PydanticField(
        max_length=MAX_RANK
    )
    #: Base64 (RFC 4648, padded) of the C-order little-endian bytes.
    data: str


class MismatchReport(BaseModel):
    model_config = REQUEST_CONFIG

    at: When
    dims: dict[ArgName, Annotated[int, Strict(), PydanticField(ge=0, le=_SAFE_INT)]] = (
        PydanticField(max_length=MAX_DIMS)
    )
    inputs: dict[ArgName, Anchor] = PydanticField(max_length=MAX_ARRAYS)
    outputs: dict[ArgName, Anchor] = PydanticField(max_length=MAX_ARRAYS)
    reference: dict[ArgName, Anchor] = PydanticField(max_length=MAX_ARRAYS)
    max_error: ErrorMetric | None
    max_ratio: ErrorMetric | None
    in_scope: Annotated[bool, Strict()]
    evidence: dict[ArgName, EvidenceArray] | None = PydanticField(max_length=MAX_ARRAYS)


class LatencyHistogram(BaseModel):
    model_config = REQUEST_CONFIG

    unit: Literal["us"]
    bounds: list[Annotated[float, PydanticField(gt=0, allow_inf_nan=False)]] = PydanticField(
        min_length=1, max_length=MAX_BUCKETS
    )
    counts: list[Count] = PydanticField(min_length=2, max_length=MAX_BUCKETS + 1)

    @model_validator(mode="after")
    def _shape(self) -> LatencyHistogram:
        if len(self.counts) != len(self.bounds) + 1:
            raise ValueError("counts has one entry per bound and one for overflow")
        if any(b <= a for a, b in zip(self.bounds, self.bounds[1:], strict=False)):
            raise ValueError("bounds must increase")
        return self


class Window(BaseModel):
    model_config = REQUEST_CONFIG

    start: When
    end: When

    @model_validator(mode="after")
    def _ordered(self) -> Window:
        if self.end < self.start:
            raise ValueError("the window ends before it starts")
        return self


class ObservationReport(BaseModel):
    model_config = REQUEST_CONFIG

    kernel: Annotated[str, StringConstraints(max_length=71, pattern=DIGEST_PATTERN)]
    target: Annotated[str, StringConstraints(max_length=128, pattern=NAME_PATTERN)]
    certificate: Annotated[str, StringConstraints(max_length=71, pattern=DIGEST_PATTERN)]
    window: Window
    calls_seen: Count
    calls_checked: Count
    dropped: Count
    out_of_scope: Count
    latency: LatencyHistogram | None = None
    mismatches: list[MismatchReport] = PydanticField(default_factory=list,
                                                     max_length=MAX_MISMATCHES)  # fmt: skip


class ObservationBatch(BaseModel):
    model_config = REQUEST_CONFIG

    reports: list[ObservationReport] = PydanticField(min_length=1, max_length=MAX_REPORTS)


class ObservationsAccepted(BaseModel):
    accepted: int
    #: Reports already stored (the same report sent again changes nothing).
    duplicates: int = 0
    mismatches_logged: int
    #: Targets on which a promotion was suspended by this batch.
    suspended: list[str]
    #: Ids of the stored mismatches, in the order sent (for their evidence).
    mismatch_ids: list[int] = []


class ObservationReportRow(SQLModel, table=True):
    __tablename__ = "observation_report"

    id: int | None = Field(default=None, primary_key=True)
    #: ``sha256`` of the report's canonical JSON: the same report twice is stored once.
    digest: str = Field(max_length=71, unique=True)
    kernel: str = Field(max_length=71, index=True)
    target_name: str = Field(foreign_key="target.name", index=True, max_length=128)
    certificate_id: str = Field(foreign_key="certificate.id", max_length=71)
    window_start: datetime = _when()
    window_end: datetime = _when()
    calls_seen: int = Field(sa_type=BigInteger)
    calls_checked: int = Field(sa_type=BigInteger)
    dropped: int = Field(sa_type=BigInteger)
    out_of_scope: int = Field(sa_type=BigInteger)
    received_at: datetime = _when()


class ObservationMismatch(SQLModel, table=True):
    __tablename__ = "observation_mismatch"
    __table_args__ = (Index("ix_observation_mismatch_kernel_target", "kernel", "target_name"),)

    id: int | None = Field(default=None, primary_key=True)
    report_id: int = Field(foreign_key="observation_report.id", index=True)
    kernel: str = Field(max_length=71)
    target_name: str = Field(foreign_key="target.name", max_length=128)
    certificate_id: str = Field(foreign_key="certificate.id", max_length=71)
    at: datetime = _when()
    #: The mismatch as reported, evidence replaced by its manifest (dtype, shape, anchor).
    report: dict[str, Any] = Field(default_factory=dict, sa_type=JSON)
    confirmed: bool = False
    suspended: bool = False
    #: The evidence arrays' bytes, one after another in the manifest's order.
    evidence: bytes | None = Field(default=None, sa_column=Column(LargeBinary, nullable=True))
    log_index: int | None = None


class MismatchPublic(BaseModel):
    id: int
    kernel: str
    target: str
    certificate: str
    report: dict[str, Any]
    confirmed: bool
    suspended: bool
    log_index: int | None


class LatencyHistogramRow(SQLModel, table=True):
    __tablename__ = "latency_histogram"
    __table_args__ = (Index("ix_latency_histogram_target_kernel", "target_name", "kernel"),)

    id: int | None = Field(default=None, primary_key=True)
    report_id: int = Field(foreign_key="observation_report.id", index=True)
    kernel: str = Field(max_length=71)
    target_name: str = Field(foreign_key="target.name", max_length=128)
    bounds: list[float] = Field(default_factory=list, sa_type=JSON)
    counts: list[int] = Field(default_factory=list, sa_type=JSON)


class LatencySample(SQLModel, table=True):
    __tablename__ = "latency_sample"
    __table_args__ = (Index("ix_latency_sample_target_kernel", "target_name", "kernel"),)

    id: int | None = Field(default=None, primary_key=True)
    kernel: str = Field(max_length=71)
    target_name: str = Field(foreign_key="target.name", max_length=128)
    #: The event's name in the trace (``aten::mm``, a CUDA kernel's symbol).
    name: str = Field(max_length=256)
    dur_us: float
    #: ``sha256`` of the ingested batch, so one trace ingested twice is stored once.
    batch: str = Field(max_length=71, index=True)
    recorded_at: datetime = _when()


class PerfSample(BaseModel):
    model_config = REQUEST_CONFIG

    name: Annotated[str, StringConstraints(max_length=256, pattern=TEXT_PATTERN)]
    start_us: Annotated[float, PydanticField(allow_inf_nan=False)]
    dur_us: Annotated[float, PydanticField(ge=0, allow_inf_nan=False)]


class PerfIngest(BaseModel):
    model_config = REQUEST_CONFIG

    kernel: Annotated[str, StringConstraints(max_length=71, pattern=DIGEST_PATTERN)]
    target: Annotated[str, StringConstraints(max_length=128, pattern=NAME_PATTERN)]
    samples: list[PerfSample] = PydanticField(min_length=1, max_length=MAX_PERF_SAMPLES)


class PerfIngested(BaseModel):
    kernel: str
    target: str
    stored: int
    #: The batch was ingested before: nothing new stored.
    duplicate: bool
    batch: str


class TargetPolicyBase(SQLModel):
    on_mismatch: str = Field(default="record", max_length=16)
    max_p99_regression_pct: float | None = None
    min_samples: int = 30


Percent = Annotated[float, PydanticField(ge=0, le=1e6, allow_inf_nan=False)]


class TargetPolicyUpdate(BaseModel):
    model_config = REQUEST_CONFIG

    on_mismatch: Literal["record", "suspend"] = "record"
    max_p99_regression_pct: Percent | None = None
    min_samples: Annotated[int, Strict(), PydanticField(ge=1, le=10_000_000)] = 30


class TargetPolicy(TargetPolicyBase, table=True):
    __tablename__ = "target_policy"

    target_name: str = Field(primary_key=True, foreign_key="target.name", max_length=128)
    updated_at: datetime = _when()
    log_index: int | None = None


class TargetPolicyPublic(TargetPolicyBase):
    target: str
    updated_at: datetime | None = None
    log_index: int | None = None

