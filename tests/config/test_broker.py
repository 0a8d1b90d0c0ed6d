"""The embedded broker: a consumer polling the folder while producers publish never reads a
message before it is whole (config/broker.py)."""

from __future__ import annotations

import threading
from pathlib import Path

from kombu import Connection

from config.celery import app


def test_filesystem_urls_use_the_whole_message_transport():
    assert type(Connection("filesystem://").transport).__module__ == "config.broker"
    assert app.conf.broker_url.startswith(("filesystem://", "redis://", "amqp://"))


def test_messages_published_while_a_consumer_polls_arrive_whole(tmp_path: Path):
    folder = tmp_path / "queue"
    folder.mkdir()
    options = {"data_folder_in": str(folder), "data_folder_out": str(folder)}
    count, producers = 300, 4
    received: list[dict[str, int]] = []
    done = threading.Event()

    def consume() -> None:
        with Connection("filesystem://", transport_options=options) as connection:
            queue = connection.SimpleQueue("bells")
            while len(received) < count * producers:
                try:
                    message = queue.get(timeout=10)
                except queue.Empty:
                    break
                message.ack()
                received.append(message.payload)
            queue.close()
        done.set()

    def produce(producer: int) -> None:
        with Connection("filesystem://", transport_options=options) as connection:
            queue = connection.SimpleQueue("bells")
            for number in range(count):
                queue.put({"producer": producer, "number": number})
            queue.close()

    consumer = threading.Thread(target=consume)
    consumer.start()
    threads = [threading.Thread(target=produce, args=(p,)) for p in range(producers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert done.wait(60)
    consumer.join()
    assert sorted((m["producer"], m["number"]) for m in received) == [
        (p, n) for p in range(producers) for n in range(count)
    ]
    assert not list(folder.glob(".*.partial"))
