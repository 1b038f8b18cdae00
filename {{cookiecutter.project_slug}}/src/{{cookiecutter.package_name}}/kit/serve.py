"""An HTTP prediction service with LitServe.

python serve.py --model runs/default/version_<N>/export/best.onnx --port 8000

POST /predict with JSON {"<field>": "<base64 of an input file>"} returns
{"class": ..., "probability": ..., "probabilities": {class name: probability}}; the field is
the project inputs module's FIELD ("image" for images). GET /health answers "ok" once the
model is loaded. An exported artifact is preprocessed from its metadata file, so serving one
imports neither Lightning nor the project's model and data classes (and an ONNX file with
its preprocessing recorded not torch: its server starts in about half the time).
"""

import base64
import binascii
import functools
import json
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import litserve as ls
import numpy as np
from fastapi import HTTPException
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from jsonargparse import ArgumentParser
from pydantic import BaseModel, ConfigDict

from .errors import ConfigError, InputTooLargeError, UnreadableInputError
from .inference import load_classifier, stack
from .project import handed_over, use

MAX_MEGABYTES = 10


class InputRequest(BaseModel):
    """The request body: a JSON object (FastAPI answers 422 to anything else) whose inputs
    module's FIELD holds the input (checked in decode_request, which answers 422 too)."""

    model_config = ConfigDict(extra="allow")


class ClassifierAPI(ls.LitAPI):
    """Decodes one input per request, runs the classifier, returns class probabilities."""

    def __init__(self, model: Path) -> None:
        super().__init__()
        self.model = model
        # LitServe's workers are spawned: they import serve.py afresh, without running its
        # __main__, and get the project here (a checkpoint is rebuilt as the project's model).
        self.project = handed_over()

    def setup(self, device: str) -> None:
        if self.project is not None:
            use(self.project)
        self.classifier = load_classifier(self.model)

    def decode_request(self, request: InputRequest) -> Any:
        inputs = self.classifier.inputs
        field, one_file = inputs.FIELD, inputs.ONE_FILE
        value = (request.model_extra or {}).get(field)
        if not isinstance(value, str):
            shape = json.dumps({field: f"<base64 of {one_file}>"})
            raise HTTPException(422, f"send JSON {shape}")
        try:
            data = base64.b64decode(value, validate=True)
        except binascii.Error:
            raise HTTPException(
                400, f"'{field}' is not base64; send the bytes of {one_file}"
            ) from None
        try:
            return self.classifier.input_of(data)
        except InputTooLargeError as error:
            raise HTTPException(413, str(error)) from None
        except UnreadableInputError as error:
            raise HTTPException(
                415, f"'{field}' could not be decoded ({error}); send the bytes of {one_file}"
            ) from None

    def predict(self, one_input: Any) -> np.ndarray:
        return self.classifier.probabilities(stack([one_input]))[0]

    def encode_response(self, probabilities: np.ndarray) -> dict:
        names = self.classifier.class_names
        best = int(probabilities.argmax())
        return {
            "class": names[best],
            "probability": float(probabilities[best]),
            "probabilities": dict(zip(names, probabilities.tolist(), strict=True)),
        }


def main(args: list[str] | None = None) -> None:
    parser = ArgumentParser(description="Serve a checkpoint or exported model over HTTP.")
    parser.add_argument("--model", type=Path, required=True, help=".ckpt, .onnx, .pt2 or .pt file")
    parser.add_argument("--host", default="127.0.0.1", help="0.0.0.0 to accept other machines.")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--max_megabytes", type=float, default=MAX_MEGABYTES, help="Largest request."
    )
    parser.add_argument("--workers", type=int, default=1, help="Model copies serving requests.")
    config = parser.parse_args(args)
    try:
        check_options(config.host, config.port, config.workers, config.max_megabytes)
        # A bad model file fails here, before the server starts.
        inputs = load_classifier(config.model).inputs
    except ConfigError as error:
        sys.exit(f"error: {error}")
    server = ls.LitServer(
        ClassifierAPI(config.model),
        accelerator="cpu",
        workers_per_device=config.workers,
        max_payload_size=int(config.max_megabytes * 1024 * 1024),
    )
    # A body that is no JSON object: FastAPI's own answer would echo the whole body back.
    shape = json.dumps({inputs.FIELD: f"<base64 of {inputs.ONE_FILE}>"})
    answer = {"detail": f"send JSON {shape} with Content-Type: application/json"}
    server.app.add_exception_handler(
        RequestValidationError, lambda *_: JSONResponse(answer, status_code=422)
    )
    # SIGTERM (a container's stop, `kill PID`) would end this process alone, its workers and
    # servers left answering on the port: it takes LitServe's Ctrl+C path, which ends them.
    signal.signal(signal.SIGTERM, functools.partial(interrupt, os.getpid()))
    server.run(host=config.host, port=config.port, generate_client_file=False)


def check_options(host: str, port: int, workers: int, max_megabytes: float) -> None:
    """Refuse, in one line, what LitServe or the operating system would refuse only later, in
    a traceback or a log line that does not name the option (or in every request's answer)."""
    if not 1024 <= port <= 65535:
        raise ConfigError(f"--port {port}: accepted: 1024 to 65535")
    if workers < 1:
        raise ConfigError(f"--workers must be a positive integer, got {workers}")
    if not max_megabytes > 0:  # NaN too
        raise ConfigError(f"--max_megabytes must be a positive number, got {max_megabytes}")
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
        try:
            probe.bind((host, port))
        except OSError as error:
            raise ConfigError(f"--port {port} on {host}: {error.strerror}") from None


def interrupt(main_process: int, signum: int, frame: object) -> None:
    if os.getpid() != main_process:  # a forked server inherited it: ends as SIGTERM ends it
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    raise KeyboardInterrupt
