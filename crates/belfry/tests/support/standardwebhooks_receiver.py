"""A webhook receiver that verifies every request with the independent
`standardwebhooks` package (PyPI), for Belfry's end-to-end signing test.

Usage: python standardwebhooks_receiver.py SECRETS_FILE LOG_FILE

Prints its port on the first line of stdout, then serves until killed.
For each POST it reads SECRETS_FILE (a JSON list of `whsec_` secrets, read
per request so the test can change it), verifies the request with each of
them (`Webhook(secret).verify(body, headers)`: signature and timestamp
tolerance), answers 204 when every one of them verifies and 400 with the
verifier's message otherwise, and appends a JSON line to LOG_FILE.
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

SECRETS_FILE, LOG_FILE = sys.argv[1], sys.argv[2]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        length = int(self.headers.get("content-length", "0"))
        body = self.rfile.read(length)
        headers = {name.lower(): value for name, value in self.headers.items()}
        with open(SECRETS_FILE) as f:
            secrets = json.load(f)
        errors = []
        for index, secret in enumerate(secrets):
            try:
                Webhook(secret).verify(body, headers)
            except WebhookVerificationError as error:
                errors.append(f"secret {index}: {error}")
        record = {
            "path": self.path,
            "webhook-id": headers.get("webhook-id"),
            "signatures": len(headers.get("webhook-signature", "").split()),
            "verified": not errors,
            "errors": errors,
        }
        with open(LOG_FILE, "a") as f:
            f.write(json.dumps(record) + "\n")
        answer = b"" if not errors else "; ".join(errors).encode()
        self.send_response(204 if not errors else 400)
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
