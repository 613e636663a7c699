import pytest
from redis.crc import key_slot

from funnel.common.keys import Keys, model_of

TEXT, IMAGE = "text-embedding", "image-classifier"


def slot(key: str) -> int:
    return key_slot(key.encode())


def test_key_names_are_readable():
    keys = Keys("funnel")
    assert keys.queue(TEXT) == "funnel:queue:{text-embedding}"
    assert keys.bulk(TEXT) == "funnel:bulk:{text-embedding}"
    assert keys.reply(TEXT, "web-ab12") == "funnel:reply:{text-embedding}:web-ab12"
    assert keys.inflight(TEXT, "w1") == "funnel:inflight:{text-embedding}:w1"
    assert keys.recovering_lock(TEXT, "w1") == "funnel:recovering:{text-embedding}:w1:lock"
    assert keys.worker(TEXT, "w1") == "funnel:worker:{text-embedding}:w1"
    assert keys.dead("m") == "funnel:dead:{m}"
    assert keys.workers() == "funnel:workers" and keys.device_claims() == "funnel:device-claims"
    assert model_of(keys.inflight(TEXT, "w1")) == TEXT and model_of(keys.workers()) == ""


def test_every_key_of_one_atomic_step_is_in_the_models_slot():
    """Redis Cluster refuses a script or MULTI whose keys span slots: these must all agree."""
    keys = Keys("funnel")
    for model in (TEXT, IMAGE, "m"):
        push = [keys.queue(model), keys.inflight(model, "w1"), keys.inflight(model, "w-2")]   # web's push script
        take = [keys.queue(model), keys.inflight(model, "w1"), keys.bulk(model)]              # take script, BLMOVE
        reply = [keys.reply(model, "web-1"), keys.reply(model, "job1"), keys.dead(model),     # reply MULTI
                 keys.inflight(model, "w1")]
        claim = [keys.worker(model, "w1"), keys.inflight(model, "w1"),                        # recovery's claim
                 keys.recovering(model, "w1"), keys.recovering_lock(model, "w1")]
        requeue = [keys.queue(model), keys.bulk(model), keys.dead(model), keys.reply(model, "x"),  # and requeue
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


def test_a_bulk_jobs_results_are_a_reply_key_except_on_a_cluster():
    results = Keys("funnel").job_results("abc")
    assert Keys("funnel").is_reply(results, "m")
    assert not Keys("funnel", cluster=True).is_reply(results, "m")  # another slot: refused there
