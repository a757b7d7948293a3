"""The README's "A two-minute tour", step by step, with the Python client
openapi-python-client generated from the node's OpenAPI document (the
package `belfry_client`, on PYTHONPATH), asserting what the tour shows.

Usage: readme_tour.py BASE_URL   (e.g. http://127.0.0.1:8080)

The tour's webhook receiver runs here, in a thread; its delays are shorter
than the tour's (seconds, not tens of them). Every wait is bounded.
"""

import datetime
import http.server
import json
import sys
import threading
import time
from typing import ClassVar

from belfry_client import Client
from belfry_client.api.bigben import (
    bigben_find,
    bigben_register_tenant,
    bigben_schedule,
)
from belfry_client.api.events import get_event, list_attempts, list_events, put_event
from belfry_client.models import (
    EventRequest,
    ProcessorConfig,
    ProcessorConfigProps,
    PutEvent,
)
from standardwebhooks.webhooks import Webhook

TENANT = "shop/orders"
# How long any awaited change may take (a debug build on a loaded machine).
DEADLINE_S = 60.0


class Receiver(http.server.BaseHTTPRequestHandler):
    """The tour's receiver: keeps what it gets and answers 200."""

    received: ClassVar[list] = []
    arrived: ClassVar[threading.Condition] = threading.Condition()

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        with Receiver.arrived:
            # Header names as one case: HTTP's are case-insensitive.
            headers = {name.lower(): value for name, value in self.headers.items()}
            Receiver.received.append((time.time(), headers, body))
            Receiver.arrived.notify_all()
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def delivery_of(event_id):
    """The first delivery of `event_id`: (arrival, headers, body)."""
    with Receiver.arrived:
        found = Receiver.arrived.wait_for(
            lambda: [d for d in Receiver.received if d[1].get("x-belfry-event-id") == event_id],
            timeout=DEADLINE_S,
        )
    assert found, f"{event_id} was not delivered within {DEADLINE_S} s"
    return found[0]


def eventually(what, read, done):
    """`read()` until `done(value)`, at most DEADLINE_S; returns the value."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        value = read()
        if done(value):
            return value
        assert time.monotonic() < deadline, f"{what}: still {value!r}"
        time.sleep(0.1)


def instant(seconds_from_now, millis=True):
    """An instant as the tour writes it (`date -u ... %3NZ` or whole
    seconds) and as a POSIX time."""
    at = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=seconds_from_now)
    at = at.replace(microsecond=at.microsecond // 1000 * 1000 if millis else 0)
    text = at.isoformat(timespec="milliseconds" if millis else "seconds")
    return text.replace("+00:00", "Z"), at.timestamp()


def main(base_url):
    receiver = http.server.HTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    hook = f"http://127.0.0.1:{receiver.server_address[1]}/hook"
    client = Client(base_url=base_url, timeout=30.0, raise_on_unexpected_status=True)

    # Register a tenant whose events go to that webhook (BigBen's API).
    registered = bigben_register_tenant.sync_detailed(
        client=client,
        body=ProcessorConfig(
            tenant=TENANT, type_="HTTP", props=ProcessorConfigProps.from_dict({"url": hook})
        ),
    )
    assert registered.status_code == 200, registered
    secret = registered.headers.get("webhook-signing-secret")
    assert secret and secret.startswith("whsec_"), registered.headers

    # Schedule an event (the tour: ten seconds from now).
    at, at_s = instant(2)
    scheduled = bigben_schedule.sync_detailed(
        client=client,
        body=[
            EventRequest(
                id="order-42-timeout", tenant=TENANT, event_time=at, payload='{"orderId": 42}'
            )
        ],
    )
    assert scheduled.status_code == 200, scheduled
    [answer] = scheduled.parsed
    assert answer.id == "order-42-timeout", answer
    assert answer.event_status == "ACCEPTED", answer
    assert isinstance(answer.event_id, str) and answer.event_id, answer

    # Look it up: UN_PROCESSED, then PROCESSED once it arrived at `AT`.
    def find():
        found = bigben_find.sync_detailed(client=client, tenant=TENANT, id="order-42-timeout")
        assert found.status_code == 200, found
        return found.parsed

    assert find().event_status == "UN_PROCESSED"
    arrival, headers, body = delivery_of("order-42-timeout")
    assert arrival >= at_s, f"delivered {at_s - arrival:.3f} s early"
    eventually("find after delivery", find, lambda e: e.event_status == "PROCESSED")

    # What the webhook receives: JSON, Belfry's headers, a signature by the
    # tenant's secret, and BigBen's EventResponse (FULL_EVENT) as the body.
    assert headers["content-type"] == "application/json", headers
    assert headers["x-belfry-tenant"] == TENANT, headers
    assert headers["x-belfry-attempt"] == "1", headers
    for name in ("x-belfry-scheduled-at", "idempotency-key", "webhook-id", "webhook-timestamp"):
        assert headers.get(name), f"no {name}: {headers}"
    Webhook(secret).verify(body, headers)
    delivered = json.loads(body)
    assert delivered["id"] == "order-42-timeout", delivered
    assert delivered["tenant"] == TENANT, delivered
    assert delivered["payload"] == '{"orderId": 42}', delivered

    # The same through /v1 (the client writes `/` in a name as %2F).
    at, at_s = instant(2, millis=False)
    put = put_event.sync_detailed(
        client=client, tenant=TENANT, id="order-43", body=PutEvent(deliver_at=datetime.datetime.fromisoformat(at), payload="hello")
    )
    assert put.status_code == 201, put
    assert put.parsed.status == "scheduled", put.parsed
    assert put.parsed.payload == "hello", put.parsed

    def status():
        read = get_event.sync_detailed(client=client, tenant=TENANT, id="order-43")
        assert read.status_code == 200, read
        return read.parsed

    assert status().status in ("scheduled", "delivered")
    arrival, _, body = delivery_of("order-43")
    assert arrival >= at_s, f"delivered {at_s - arrival:.3f} s early"
    assert json.loads(body)["payload"] == "hello", body
    viewed = eventually("order-43 after delivery", status, lambda e: e.status == "delivered")
    assert viewed.attempts == 1 and viewed.last_error is None, viewed

    attempts = list_attempts.sync_detailed(client=client, tenant=TENANT, id="order-43")
    assert attempts.status_code == 200, attempts
    [attempt] = attempts.parsed.attempts
    assert attempt.number == 1 and attempt.outcome == "delivered", attempt
    assert attempt.http_status == 200, attempt

    listed = list_events.sync_detailed(client=client, tenant=TENANT, status="delivered", limit=10)
    assert listed.status_code == 200, listed
    ids = sorted(event.id for event in listed.parsed.events)
    assert ids == ["order-42-timeout", "order-43"], ids

    receiver.shutdown()
    print("tour done")


if __name__ == "__main__":
    main(sys.argv[1])
