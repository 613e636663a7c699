"""Reading a request's items, by the input kind of the model's task.

    image  one image: multipart field `file`, or a raw image/* (or octet-stream) body;
           a bulk job's images: multipart, one `file` field each (read_images)
    text   JSON {"text": "..."} or {"texts": ["...", ...]}
    json   JSON {"input": <any JSON value>} or {"inputs": [<value>, ...]}
    file   files of the content types the task declares: multipart, one `file` field each (one item
           each), or a raw body of one of those types; each item an Upload (bytes, content type)

Returns (items, single): single answers with one result at the top level,
otherwise with "results" in request order.
"""

from __future__ import annotations

from typing import Any

from werkzeug.wrappers import Request

from funnel.common.errors import BadInput, UnsupportedMediaType
from funnel.common.tasks import Task, Upload


def read_items(task: Task, request: Request, max_items: int) -> tuple[list[Any], bool]:
    kind = task.input_kind
    if kind == "image":
        return [read_image(request)], True
    if kind == "file":
        files = read_files(task, request, max_items)
        return files, len(files) == 1  # one file is answered as one, several as "results"
    one, many = ("text", "texts") if kind == "text" else ("input", "inputs")
    items, single = read_json_items(request, one, many, max_items)
    if kind == "text" and not all(isinstance(t, str) for t in items):
        raise BadInput("every text must be a string", code="bad_json")
    return items, single


def read_image(request: Request) -> bytes:
    mimetype = request.mimetype or ""
    if mimetype == "multipart/form-data":
        upload = request.files.get("file")
        if upload is None:
            raise BadInput("multipart upload needs a field named 'file'", code="missing_file")
        data = upload.read()
    elif mimetype.startswith("image/") or mimetype == "application/octet-stream":
        data = request.get_data()
    else:
        raise UnsupportedMediaType(
            f"send an image as multipart field 'file' or as an image/* body, not {mimetype or 'no content type'}")
    if not data:
        raise BadInput("the image is empty", code="empty_input")
    return data


def content_type(task: Task, given: str) -> str:
    """The content type of a `file` task's upload, if the task declares it (exactly, or as "type/*");
    else 415, naming the ones it takes."""
    mimetype = given.split(";", 1)[0].strip().lower()
    for declared in task.content_types:
        if mimetype == declared or declared.endswith("/*") and mimetype.startswith(declared[:-1]):
            return mimetype
    raise UnsupportedMediaType(f"{task.spec.name} takes files of {', '.join(task.content_types)}, "
                               f"not {mimetype or 'no content type'}")


def read_files(task: Task, request: Request, max_items: int) -> list[Upload]:
    """A `file` task's items: each multipart `file` field (one item each), or the raw body."""
    if request.mimetype == "multipart/form-data":
        uploads = request.files.getlist("file")
        if not uploads:
            raise BadInput("multipart upload needs a field named 'file' (one per item)", code="missing_file")
        if len(uploads) > max_items:
            raise BadInput(f"{len(uploads)} files in one request; the limit is {max_items}", code="too_many_items")
        files = [Upload(upload.read(), content_type(task, upload.mimetype)) for upload in uploads]
    else:
        files = [Upload(request.get_data(), content_type(task, request.mimetype))]
    for i, upload in enumerate(files):
        if not upload.data:
            raise BadInput(f"item {i}: the file is empty" if len(files) > 1 else "the file is empty",
                           code="empty_input")
    return files


def read_images(request: Request, max_items: int) -> list[bytes]:
    """Many images for one bulk job: multipart, one `file` field per image."""
    if request.mimetype != "multipart/form-data":
        raise UnsupportedMediaType("send a bulk job's images as multipart/form-data, one field named 'file' "
                                   f"per image, not {request.mimetype or 'no content type'}")
    uploads = request.files.getlist("file")
    if not uploads:
        raise BadInput("multipart upload needs a field named 'file' (one per image)", code="missing_file")
    if len(uploads) > max_items:
        raise BadInput(f"{len(uploads)} images in one job; the limit is {max_items}", code="too_many_items")
    images = [upload.read() for upload in uploads]
    for i, data in enumerate(images):
        if not data:
            raise BadInput(f"item {i}: the image is empty", code="empty_input")
    return images


def read_json_items(request: Request, one: str, many: str, max_items: int) -> tuple[list[Any], bool]:
    if request.mimetype != "application/json":
        raise UnsupportedMediaType(
            f'send JSON {{"{one}": ...}} or {{"{many}": [...]}} as application/json, '
            f"not {request.mimetype or 'no content type'}")
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        raise BadInput(f'body must be a JSON object {{"{one}": ...}} or {{"{many}": [...]}}', code="bad_json")
    if (one in body) == (many in body):
        raise BadInput(f'give exactly one of "{one}" or "{many}"', code="bad_json")
    single = one in body
    items = [body[one]] if single else body[many]
    if not isinstance(items, list) or not items:
        raise BadInput(f'"{many}" must be a non-empty list', code="bad_json")
    if len(items) > max_items:
        raise BadInput(f"{len(items)} {many} in one request; the limit is {max_items}", code="too_many_items")
    return items, single
