"""A local server in the Hugging Face Hub's layout, for what huggingface_hub asks of it: a
repository's file list (/api/models/OWNER/REPO/tree/REV) and its files
(/OWNER/REPO/resolve/REV/FILE: HEAD for the commit, sha256 and size, GET with Range for the
bytes). It can gate a repository behind a token, give a wrong sha256, or drop a download
halfway once (to be resumed)."""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

COMMIT = "c0ffee" * 6 + "c0ff"  # 40 hex digits


@dataclass
class Hub:
    repos: dict[str, dict[str, bytes]] = field(default_factory=dict)
    gated: dict[str, str] = field(default_factory=dict)  # repo -> the token that opens it
    wrong_sha: set[str] = field(default_factory=set)     # file names whose sha256 the Hub misstates
    drop_once: set[str] = field(default_factory=set)     # file names whose first GET stops halfway
    ranges: list[tuple[str, int]] = field(default_factory=list)  # (file, first byte) of each GET

    def add(self, repo: str, name: str, data: bytes | Path) -> None:
        self.repos.setdefault(repo, {})[name] = data.read_bytes() if isinstance(data, Path) else data

    def sha(self, name: str, data: bytes) -> str:
        return hashlib.sha256(data + (b"x" if name in self.wrong_sha else b"")).hexdigest()


def serve(hub: Hub) -> tuple[ThreadingHTTPServer, str]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_HEAD(self):
            self.answer(body=False)

        def do_GET(self):
            self.answer(body=True)

        def fail(self, status: int, code: str, message: str) -> None:
            self.send_response(status)
            self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", message)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def answer(self, body: bool) -> None:
            path = unquote(urlparse(self.path).path).strip("/").split("/")
            api = path[:2] == ["api", "models"]
            repo = "/".join(path[2:4] if api else path[:2])
            if repo not in hub.repos:
                return self.fail(404, "RepoNotFound", "Repository not found")
            if repo in hub.gated and self.headers.get("Authorization") != f"Bearer {hub.gated[repo]}":
                return self.fail(403 if self.headers.get("Authorization") else 401, "GatedRepo",
                                 "Access to this model is restricted")
            files = hub.repos[repo]
            if api and path[4:5] == ["tree"]:
                listing = [{"type": "file", "path": n, "size": len(d), "oid": hashlib.sha1(d).hexdigest(),
                            "lfs": {"oid": hub.sha(n, d), "size": len(d), "pointerSize": 134}}
                           for n, d in files.items()]
                return self.send(json.dumps(listing).encode(), "application/json", body)
            name = "/".join(path[4:]) if path[2:3] == ["resolve"] else ""
            if name not in files:
                return self.fail(404, "EntryNotFound", "Entry not found")
            data = files[name]
            start = int(self.headers.get("Range", "bytes=0-")[6:].split("-")[0] or 0)
            if body:
                hub.ranges.append((name, start))
            self.send_response(206 if start else 200)
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("X-Linked-Etag", f'"{hub.sha(name, data)}"')
            self.send_header("X-Linked-Size", str(len(data)))
            self.send_header("ETag", f'"{hub.sha(name, data)}"')
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(len(data) - start))
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.end_headers()
            if not body:
                return
            if name in hub.drop_once:
                hub.drop_once.discard(name)
                self.wfile.write(data[start:start + (len(data) - start) // 2])
                self.wfile.flush()
                self.connection.shutdown(2)  # the link goes halfway through
                return
            self.wfile.write(data[start:])

        def send(self, data: bytes, kind: str, body: bool) -> None:
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if body:
                self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"
