"""An independent Kafka client for Belfry's tests (confluent-kafka).

  produce BOOTSTRAP TOPIC IN OUT      records from IN (JSON lines: key, value
                                      as a string) in order; writes one JSON
                                      line per acknowledged record to OUT:
                                      key, partition, offset
  consume BOOTSTRAP TOPIC COUNT SECS  the first COUNT records of TOPIC (a
                                      fresh group), one JSON line each: key,
                                      value, headers; exits 1 if fewer came
  committed BOOTSTRAP GROUP TOPIC N   the group's committed offset of
                                      partitions 0..N-1 as a JSON list
                                      (-1: none)
"""

import json
import sys
import time
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition


def produce(bootstrap, topic, path_in, path_out):
    producer = Producer({
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "linger.ms": 5,
    })
    out = open(path_out, "w")
    failures = []

    def delivered(err, msg):
        if err is not None:
            failures.append(str(err))
            return
        out.write(json.dumps({
            "key": msg.key().decode(),
            "partition": msg.partition(),
            "offset": msg.offset(),
        }) + "\n")

    with open(path_in) as lines:
        for line in lines:
            record = json.loads(line)
            while True:
                try:
                    producer.produce(topic, key=record["key"].encode(),
                                     value=record["value"].encode(),
                                     on_delivery=delivered)
                    break
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0)
    remaining = producer.flush(60)
    out.close()
    if failures or remaining:
        print(f"produce failed: {failures[:3]} remaining={remaining}", file=sys.stderr)
        sys.exit(1)


def consume(bootstrap, topic, count, seconds):
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": f"test-reader-{uuid.uuid4()}",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    })
    consumer.subscribe([topic])
    deadline = time.time() + seconds
    seen = 0
    while seen < count and time.time() < deadline:
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        if msg.error():
            print(f"consume error: {msg.error()}", file=sys.stderr)
            continue
        headers = {k: (v.decode() if v is not None else None)
                   for k, v in (msg.headers() or [])}
        print(json.dumps({
            "key": msg.key().decode() if msg.key() is not None else None,
            "value": msg.value().decode() if msg.value() is not None else None,
            "headers": headers,
        }), flush=True)
        seen += 1
    consumer.close()
    if seen < count:
        print(f"only {seen} of {count} records on {topic}", file=sys.stderr)
        sys.exit(1)


def committed(bootstrap, group, topic, partitions):
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    offsets = consumer.committed(
        [TopicPartition(topic, p) for p in range(partitions)], timeout=30)
    consumer.close()
    print(json.dumps([tp.offset if tp.offset >= 0 else -1 for tp in offsets]))


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    if command == "produce":
        produce(*args)
    elif command == "consume":
        consume(args[0], args[1], int(args[2]), float(args[3]))
    elif command == "committed":
        committed(args[0], args[1], args[2], int(args[3]))
    else:
        sys.exit(f"unknown command {command}")
