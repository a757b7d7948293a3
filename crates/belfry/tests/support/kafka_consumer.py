"""An independent Kafka consumer for Belfry's end-to-end tests.

Usage: kafka_consumer.py BOOTSTRAP TOPIC GROUP

Reads every partition of TOPIC from the earliest offset (assigned, not
through a consumer group: nothing to rebalance when the broker goes away)
with confluent-kafka (librdkafka under
Python, not Belfry's code) and prints one JSON line per record:
{"key", "value", "headers": {name: value}, "partition", "offset",
"timestamp" (the record's), "received_ms" (this process's wall clock when
the record arrived)}. Keys, values and header values are UTF-8 text (None
when absent). Runs until killed.
"""

import json
import sys
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition


def text(raw):
    return None if raw is None else raw.decode("utf-8")


def main():
    bootstrap, topic, group = sys.argv[1:4]
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    metadata = consumer.list_topics(topic, timeout=30)
    partitions = sorted(metadata.topics[topic].partitions)
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
    print(json.dumps({"ready": True}), flush=True)
    try:
        while True:
            message = consumer.poll(0.2)
            if message is None:
                continue
            if message.error():
                # Broker outages are part of the tests: report, keep going.
                print(json.dumps({"error": str(message.error())}), flush=True)
                continue
            received_ms = int(time.time() * 1000)
            headers = {name: text(value) for name, value in (message.headers() or [])}
            _, timestamp = message.timestamp()
            print(
                json.dumps(
                    {
                        "key": text(message.key()),
                        "value": text(message.value()),
                        "headers": headers,
                        "partition": message.partition(),
                        "offset": message.offset(),
                        "timestamp": timestamp,
                        "received_ms": received_ms,
                    }
                ),
                flush=True,
            )
    except (KafkaException, KeyboardInterrupt):
        pass
    finally:
        consumer.close()


if __name__ == "__main__":
    main()
