"""The embedded broker: Kombu's filesystem transport, with messages that appear whole.

Kombu's own `_put` creates the message file under its final name and writes it afterwards, so
a worker polling the folder can take the file while it is still empty, fail to decode it and
stop (seen with a few web requests submitting at once). Here a message is written under a name
the reader ignores and renamed into place, which is atomic within one folder.
"""

from __future__ import annotations

import os
import uuid
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

__all__ = ["Channel", "Transport"]


class Channel(filesystem.Channel):
    # Kombu's stubs give this method two signatures (the abstract channel's and the filesystem
    # one's); this is the filesystem one's.
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        # The reader takes only names whose part after the first dot is "<queue>.msg".
        partial = os.path.join(self.data_folder_out, f".{name}.partial")
        try:
            with open(partial, "wb") as body:
                body.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)
        except OSError as error:
            raise ChannelError(f"Cannot add file {final!r} to directory") from error


class Transport(filesystem.Transport):
    Channel = Channel
