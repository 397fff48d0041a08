"""torch.distributed for one process that speaks for every rank (tests/run/queue_worker.py): rank
0 of a world of 1, each collective over itself."""


def get_rank():
    return 0


def get_world_size():
    return 1


def broadcast_object_list(objects, src=0):
    return None


def all_gather_object(output, obj):
    output[0] = obj
