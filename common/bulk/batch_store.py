"""OpenAI batches over bulk jobs: the uploaded input files and each batch's description, in Redis.

Plain Redis with explicit arguments, no web framework: web/routes/batches.py parses a request,
calls this and the job store, and renders what they return (web/protocols/openai_batch.py).

A batch is a bulk job (common/bulk/job_store.py), id `batch_<job id>`: the same durability,
ownership, idempotency and bulk lane. Its description (Description: the input file, the
endpoint, and each request line's custom_id and items) is msgpack in the job's record, field
jobs.BATCH_FIELD, so it is written in the job's own transaction and expires with it.

An input file is a hash `funnel:file:{<id>}` (its name, purpose, size, owner, and its bytes),
kept FUNNEL_JOB_TTL_S from its upload; its id is `file-` and 32 hex digits that start with its
creation time, as a job's do, so an expired file reads 410 and an unknown one 404. The output and
error files are not stored: `file-<job id>-output` and `file-<job id>-errors` are rendered from the
job's results as they are downloaded, and live as long as the job.

Each API key's batches and files are listed from a sorted set of its own (every score 0, ids in
lexical order, which is creation order), trimmed of what is past the TTL as it is read.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

import msgpack
import redis

from funnel.common.bulk import jobs
from funnel.common.bulk.job_store import Gone
from funnel.common.bulk.jobs import Caller
from funnel.common.contracts.keys import Keys
from funnel.common.contracts.wire import now_ms
from funnel.common.errors import NotFound
from funnel.common.link import lua_scripts
from funnel.common.link.connection import scan_keys

BATCH_PREFIX = "batch_"
FILE_PREFIX = "file-"
OUTPUT, ERRORS = "output", "errors"  # the two files a batch's job answers into
FILE_FIELDS = ("filename", "purpose", "bytes", "created_ms", "owner", "lines")
LINES_FIELD = "batch_lines"  # the job record's field of a batch's lines (Description)


@dataclass(frozen=True, kw_only=True)
class RequestLine:
    """A request line that became items of the job: items start to start + count."""

    number: int      # its line in the input file, from 1
    custom_id: str
    start: int
    count: int
    tokens: int      # what the web tier's tokenizer made of its texts: the answer's usage
    base64: bool     # encoding_format "base64"


@dataclass(frozen=True, kw_only=True)
class Rejected:
    """A line that is no request the endpoint takes: it goes to the error file, never to the job."""

    number: int
    custom_id: str | None
    code: str
    message: str
    param: str | None = None
    status: int = 0  # 400: a request the endpoint refuses (answered as such); 0: not a request at all


@dataclass(kw_only=True)
class Description:
    """What a batch's job alone does not say: OpenAI's fields and each line's part of the job.

    Kept as two fields of the record: the head (jobs.BATCH_FIELD: OpenAI's fields, the counts of
    lines), read by every retrieve, and the lines (LINES_FIELD), read only to write the output and
    error files: a 10,000-line batch's lines are 200 KB a poll would otherwise decode."""

    input_file_id: str
    endpoint: str
    completion_window: str
    model: str
    good: int        # lines that became items
    refused: int     # lines that went to the error file at create
    metadata: dict[str, str] | None = None
    cancelled_ms: int = 0
    counts: list[int] = field(default_factory=list)  # [completed, failed] once known for good
    lines: list[RequestLine] = field(default_factory=list)          # loaded only when asked for
    rejected: list[Rejected] = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.good + self.refused

    def encode(self) -> bytes:
        """The head."""
        head = {k: v for k, v in asdict(self).items() if k not in ("lines", "rejected")}
        return msgpack.packb(head, use_bin_type=True)

    def encode_lines(self) -> bytes:
        return msgpack.packb([[list(asdict(line).values()) for line in self.lines],
                              [list(asdict(r).values()) for r in self.rejected]], use_bin_type=True)

    @classmethod
    def decode(cls, head: bytes, lines: bytes | None = None) -> Description:
        made = cls(**msgpack.unpackb(head, raw=False))
        if lines is not None:
            good, refused = msgpack.unpackb(lines, raw=False)  # each row its fields' values, in order
            line_names, rejected_names = [f.name for f in fields(RequestLine)], [f.name for f in fields(Rejected)]
            made.lines = [RequestLine(**dict(zip(line_names, row))) for row in good]
            made.rejected = [Rejected(**dict(zip(rejected_names, row))) for row in refused]
        return made


@dataclass(frozen=True, kw_only=True)
class File:
    id: str
    filename: str
    purpose: str
    bytes: int
    created_ms: int
    owner: str
    lines: int


def batch_id(job_id: str) -> str:
    return BATCH_PREFIX + job_id


def job_of_batch(batch: str) -> str:
    """The job id of a batch id; NotFound for anything else."""
    job_id = batch.removeprefix(BATCH_PREFIX)
    if not batch.startswith(BATCH_PREFIX) or not jobs.is_job_id(job_id):
        raise NotFound(f"no batch {batch!r}", code="unknown_batch")
    return job_id


def result_file_id(job_id: str, kind: str) -> str:
    return f"{FILE_PREFIX}{job_id}-{kind}"


def parse_file_id(file_id: str) -> tuple[str, str]:
    """(the 32 hex digits, "" for an input file or OUTPUT or ERRORS for a batch's); NotFound else."""
    hexid, _, kind = file_id.removeprefix(FILE_PREFIX).partition("-")
    if not file_id.startswith(FILE_PREFIX) or not jobs.is_job_id(hexid) or kind not in ("", OUTPUT, ERRORS):
        raise NotFound(f"no file {file_id!r}", code="unknown_file")
    return hexid, kind


class BatchStore:
    def __init__(self, client: redis.Redis, keys: Keys, ttl_s: int):
        self.client, self.keys, self.ttl_s = client, keys, ttl_s
        self._describe = lua_scripts.register(client, "batch_describe")

    # -- input files -------------------------------------------------------------------------

    def put_file(self, filename: str, purpose: str, content: bytes, lines: int, caller: Caller) -> File:
        """Keep an uploaded file for the TTL, the caller's; listed among its files."""
        created = now_ms()
        hexid = jobs.new_job_id(created)
        made = File(id=FILE_PREFIX + hexid, filename=filename, purpose=purpose, bytes=len(content), created_ms=created,
                    owner=caller.owner, lines=lines)
        key = self.keys.file(hexid)
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(key, mapping={**{name: getattr(made, name) for name in FILE_FIELDS}, "content": content})
        pipe.pexpire(key, self.ttl_s * 1000)
        pipe.execute()
        self._index(self.keys.files_of(caller.owner), hexid)  # on a cluster in another slot: a step of its own
        return made

    def file(self, file_id: str, caller: Caller) -> File:
        """An input file the caller may read; NotFound, or Gone past its TTL, for any other."""
        hexid, kind = parse_file_id(file_id)
        values = self.client.hmget(self.keys.file(hexid), FILE_FIELDS) if not kind else [None]
        return self._visible(file_id, hexid, dict(zip(FILE_FIELDS, values)), caller)

    def content(self, file_id: str, caller: Caller) -> bytes:
        hexid, _ = parse_file_id(file_id)
        values: list = self.client.hmget(self.keys.file(hexid), [*FILE_FIELDS, "content"])
        self._visible(file_id, hexid, dict(zip(FILE_FIELDS, values)), caller)
        return values[-1] or b""

    def delete_file(self, file_id: str, caller: Caller) -> None:
        hexid, _ = parse_file_id(file_id)
        made = self.file(file_id, caller)
        self.client.delete(self.keys.file(hexid))
        self.client.zrem(self.keys.files_of(made.owner), hexid)

    def files(self, caller: Caller, after: str | None, limit: int) -> tuple[list[File], bool]:
        """The caller's input files, newest first, after the file id `after`; and whether more follow."""
        hexids, more = self._page(self.keys.files_of(caller.owner), after and parse_file_id(after)[0], limit)
        found = [self._file_or_none(hexid, caller) for hexid in hexids]
        return [f for f in found if f is not None], more

    def _file_or_none(self, hexid: str, caller: Caller) -> File | None:
        try:
            return self.file(FILE_PREFIX + hexid, caller)
        except (NotFound, Gone):
            return None

    def _visible(self, file_id: str, hexid: str, raw: dict, caller: Caller) -> File:
        fields = {k: v.decode() for k, v in raw.items() if v is not None}
        owner = fields.get("owner", "")
        if not fields or not caller.owns(owner):
            if jobs.created_ms_of(hexid) + self.ttl_s * 1000 <= now_ms():
                raise Gone(f"file {file_id} has expired: files are kept {self.ttl_s} s")
            raise NotFound(f"no file {file_id!r}", code="unknown_file")
        return File(id=file_id, filename=fields["filename"], purpose=fields["purpose"], bytes=int(fields["bytes"]),
                    created_ms=int(fields["created_ms"]), owner=owner, lines=int(fields["lines"]))

    # -- batches -----------------------------------------------------------------------------

    def added(self, job_id: str, caller: Caller) -> None:
        """List a new batch among the caller's."""
        self._index(self.keys.batches_of(caller.owner), job_id)

    def description(self, job_id: str, lines: bool = False) -> Description | None:
        """The batch's description, its lines too when asked; None for a job that is no batch."""
        found = self.client.hmget(self.keys.job(job_id), [jobs.BATCH_FIELD, *([LINES_FIELD] if lines else [])])
        head, body = found[0], (found[1] if lines else None)
        return Description.decode(head, body) if head else None  # type: ignore[arg-type]

    def update(self, job_id: str, description: Description) -> None:
        """Write a description's head again (its cancel time, its final counts), only while the job lives."""
        self._describe(keys=[self.keys.job(job_id)], args=[jobs.BATCH_FIELD, description.encode()])

    def in_flight(self, job_id: str, model: str) -> bool:
        """Whether a worker holds an item of the job: after a cancel, what was taken before it is
        still answered, and a batch is `cancelling` until it is. A few short lists (a batch or two
        per worker), scanned only for a cancelled batch not yet settled."""
        marker = self.keys.job_results(job_id).encode()  # in every item's message, as its reply_to
        return any(marker in raw for key in scan_keys(self.client, self.keys.inflight_pattern(model))
                   for raw in self.client.lrange(key, 0, -1))

    def batches(self, caller: Caller, after: str | None, limit: int) -> tuple[list[str], bool]:
        """The caller's batches' job ids, newest first, after the batch id `after`; whether more follow."""
        return self._page(self.keys.batches_of(caller.owner), after and job_of_batch(after), limit)

    # -- the lists ---------------------------------------------------------------------------

    def _index(self, key: str, hexid: str) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.zadd(key, {hexid: 0})
        pipe.pexpire(key, self.ttl_s * 1000 * 2)  # a key that stops using the server leaves no list behind
        pipe.execute()

    def _page(self, key: str, after: str | None, limit: int) -> tuple[list[str], bool]:
        cutoff = f"{max(0, now_ms() - self.ttl_s * 1000):012x}"  # ids start with their creation time
        pipe = self.client.pipeline(transaction=False)
        pipe.zremrangebylex(key, "-", f"({cutoff}")
        pipe.zrevrangebylex(key, f"({after}" if after else "+", "-", start=0, num=limit + 1)
        _, found = pipe.execute()
        ids = [i.decode() for i in found]
        return ids[:limit], len(ids) > limit

