"""An image's likeliest labels, each with its words' embedding: two served models in sequence.

    funnel add label-words --task labelwords.tasks:LabelWords --steps image-classifier,text-embedding

Step 0 classifies the image once; step 1 embeds each of the top labels (a fan-out), in the text
model's batches with everyone else's texts.
"""

from __future__ import annotations

from typing import Any

from funnel import Chain, StepFailed


class LabelWords(Chain):
    input_kind = "image"

    def preprocess(self, item: bytes):
        return self.step_task(0).preprocess(item)  # the classifier's own pixels

    def next_items(self, step, item, context, done):
        if step == 0:
            return [item]
        (classes,) = done[0]
        if isinstance(classes, StepFailed):
            raise classes  # the request fails as the classifier failed it
        labels = classes["predictions"][:int(self.spec.config.get("labels", 3))]
        return [self.step_task(1).preprocess(label["label"]) for label in labels]

    def answer(self, item, context, done) -> dict[str, Any]:
        predictions = done[0][0]["predictions"][:len(done[1])]
        return {"labels": [
            {"label": p["label"], "probability": p["probability"],
             **({"error": e.public()} if isinstance(e, StepFailed) else {"embedding": e["embedding"]})}
            for p, e in zip(predictions, done[1])]}
