"""Small pieces the three codecs share."""

from __future__ import annotations

from agentserve.api.errors import ApiError, InternalError, OverloadedError
from agentserve.conversation import Finish, Image


def finish_error(finish: Finish) -> ApiError | None:
    """The error a failed generation is reported as (any API), or None for a normal finish."""
    if finish.reason == "error":
        return InternalError("the model failed while generating the response")
    if finish.reason == "abort":
        # Aborted by the server side (worker lost, shutdown): a retry lands elsewhere.
        return OverloadedError("generation was aborted; retry the request")
    return None


def parse_data_url(url: str) -> Image:
    """`data:image/png;base64,...` into media type and data; anything else stays a URL."""
    if url.startswith("data:"):
        header, sep, payload = url[5:].partition(",")
        if sep and header.endswith(";base64"):
            return Image(media_type=header[: -len(";base64")], data=payload)
    return Image(url=url)
