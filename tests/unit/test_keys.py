import pytest
from redis.crc import key_slot

from funnel.common.contracts.keys import Keys, model_of, version_of

TEXT, IMAGE = "text-embedding", "image-classifier"


def slot(key: str) -> int:
    return key_slot(key.encode())


def test_key_names_are_readable():
    keys = Keys("funnel")
    assert keys.queue(TEXT) == keys.queue(TEXT, 1) == "funnel:queue:{text-embedding}:1"
    assert keys.queue(TEXT, 2) == "funnel:queue:{text-embedding}:2"
    assert keys.bulk(TEXT) == "funnel:bulk:{text-embedding}:1"
    assert keys.bulk(TEXT, 12) == "funnel:bulk:{text-embedding}:12"
    assert keys.traffic(TEXT) == "funnel:traffic:{text-embedding}"
    assert keys.reply(TEXT, "web-ab12") == "funnel:reply:{text-embedding}:web-ab12"
    assert keys.inflight(TEXT, "w1") == "funnel:inflight:{text-embedding}:w1"
    assert keys.recovering_lock(TEXT, "w1") == "funnel:recovering:{text-embedding}:w1:lock"
    assert keys.worker(TEXT, "w1") == "funnel:worker:{text-embedding}:w1"
    assert keys.dead("m") == "funnel:dead:{m}"
    assert keys.workers() == "funnel:workers" and keys.device_claims() == "funnel:device-claims"
    assert model_of(keys.inflight(TEXT, "w1")) == TEXT and model_of(keys.workers()) == ""
    assert model_of(keys.queue(TEXT, 3)) == TEXT and model_of(keys.traffic(TEXT)) == TEXT


def test_the_version_a_queue_key_names():
    keys = Keys("funnel")
    assert version_of(keys.queue(TEXT, 2)) == 2 and version_of(keys.bulk(TEXT, 10)) == 10
    for other in (keys.dead(TEXT), keys.traffic(TEXT), keys.workers(), keys.recovering_lock(TEXT, "7"),
                  "funnel:queue:{m}:0", "funnel:queue:{m}:02", "funnel:queue:{m}:x"):
        assert version_of(other) == 0, other


@pytest.mark.parametrize("version", [0, -1, True, 1.0, "1", None])
def test_a_version_is_a_positive_integer(version):
    with pytest.raises(ValueError, match="version"):
        Keys().queue(TEXT, version)
    with pytest.raises(ValueError, match="version"):
        Keys().bulk(TEXT, version)


def test_patterns_cover_every_version():
    keys = Keys("funnel")
    assert keys.pattern("queue") == "funnel:queue:*" and keys.pattern("traffic") == "funnel:traffic:*"
    with pytest.raises(ValueError):
        keys.pattern("queues")


def test_every_key_of_one_atomic_step_is_in_the_models_slot():
    """Redis Cluster refuses a script or MULTI whose keys span slots: these must all agree."""
    keys = Keys("funnel")
    for model in (TEXT, IMAGE, "m"):
        for version in (1, 2, 37):
            push = [keys.queue(model, version), keys.inflight(model, "w1"),                   # web's push script
                    keys.inflight(model, "w-2"), keys.traffic(model)]
            take = [keys.queue(model, version), keys.inflight(model, "w1"), keys.bulk(model, version)]  # take, BLMOVE
            reply = [keys.reply(model, "web-1"), keys.reply(model, "job1"), keys.dead(model),  # reply MULTI
                     keys.inflight(model, "w1")]
            claim = [keys.worker(model, "w1"), keys.inflight(model, "w1"),                     # recovery's claim
                     keys.recovering(model, "w1"), keys.recovering_lock(model, "w1")]
            # The requeue MULTI puts a dead worker's jobs back on each job's own version's queues.
            requeue = [keys.queue(model, version), keys.bulk(model, version), keys.queue(model, 1),
                       keys.bulk(model, 1), keys.dead(model), keys.reply(model, "x"),
                       keys.recovering(model, "w1"), keys.recovering_lock(model, "w1")]
            assert {slot(k) for k in push + take + reply + claim + requeue} == {slot(keys.queue(model))}


def test_different_models_land_in_different_slots():
    keys = Keys("funnel")
    assert slot(keys.queue(TEXT)) != slot(keys.queue(IMAGE))
    # The three-primary split of `redis-cli --cluster create` (0-5460, 5461-10922, 10923-16383)
    # puts the two shipped models on different nodes.
    assert slot(keys.queue(TEXT)) // 5461 != slot(keys.queue(IMAGE)) // 5461


@pytest.mark.parametrize("name", ["", "a b", "a:b", "../x", "*", "x" * 65, "-lead", "{x}", "a}"])
def test_unsafe_names_never_become_keys(name):
    with pytest.raises(ValueError):
        Keys().queue(name)


def test_a_prefix_with_braces_is_refused():
    with pytest.raises(ValueError, match="braces"):
        Keys("fun{nel}")


def test_reply_keys_are_recognised():
    keys = Keys("funnel")
    assert keys.is_reply("funnel:reply:{m}:abc", "m")
    assert not keys.is_reply("funnel:reply:{other}:abc", "m")  # another model's slot
    assert not keys.is_reply("funnel:queue:{m}", "m")
    assert not keys.is_reply("other:reply:{m}:abc", "m")
    assert not keys.is_reply("funnel:reply:{m}:a:b", "m")
    assert not keys.is_reply("funnel:reply:abc", "m")


def test_a_bulk_jobs_results_are_answered_everywhere_but_in_the_models_steps_only_off_a_cluster():
    results = Keys("funnel").job_results("abc")
    assert Keys("funnel").is_reply(results, "m")
    assert not Keys("funnel", cluster=True).is_reply(results, "m")  # another slot: stored apart there
    for keys in (Keys("funnel"), Keys("funnel", cluster=True)):
        assert keys.answers_to(results, "m") and keys.answers_to(keys.reply("m", "web-1"), "m")
        assert not keys.answers_to(keys.job("abc"), "m") and not keys.answers_to(keys.reply("other", "x"), "m")


def test_a_jobs_keys_share_its_slot_and_its_idempotency_keys_their_models():
    """The store, cancel and webhook scripts touch a job's record and results together; the submit's
    MULTI watches and sets an Idempotency-Key with the model's bulk queue."""
    keys = Keys("funnel")
    for job_id in ("0190abcdef01" + "0" * 20, "0190abcdef01" + "f" * 20, "j"):
        assert slot(keys.job(job_id)) == slot(keys.job_results(job_id))
    spread = {slot(keys.job(f"{i:032x}")) for i in range(64)}
    assert len(spread) > 32  # jobs spread over the slots (and so the nodes), not all on their model's
    for model in (TEXT, IMAGE, "m"):
        assert slot(keys.idempotency(model, "ab" * 24)) == slot(keys.bulk(model, 2)) == slot(keys.queue(model))
