"""funnel-client: call a Funnel server from Python, with the standard library only.

    from funnel_client import Client

    with Client("http://127.0.0.1:8000") as client:
        top5 = client.predict("image-classifier", image="cat.jpg")["predictions"]
"""

from funnel_client.client import (
                                  BadRequest,
                                  Client,
                                  ConnectionFailed,
                                  FunnelHTTPError,
                                  NotFound,
                                  ServerBusy,
                                  ServerError,
                                  Timeout,
                                  Unauthorized,
                                  WebhookVerificationError,
                                  error_for,
                                  guess_image_type,
                                  read_file,
                                  read_image,
                                  verify_webhook,
)

__all__ = ["Client", "FunnelHTTPError", "BadRequest", "Unauthorized", "NotFound", "ServerBusy",
           "Timeout", "ServerError", "ConnectionFailed", "error_for", "guess_image_type", "read_file", "read_image",
           "verify_webhook", "WebhookVerificationError"]
