"""The converters' split rule (counter_rng.h: split_key), recomputed
independently for the tests: an item named NAME (a file's path inside its
class folder, a caption's image path) has the key
splitmix64(fnv1a64(NAME) ^ splitmix64(SEED)); the items with the smallest
keys (ties: by name) go to validation."""

M = (1 << 64) - 1


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & M
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M
    return x ^ (x >> 31)


def fnv1a64(s):
    h = 14695981039346656037
    for b in s.encode():
        h = ((h ^ b) * 1099511628211) & M
    return h


def by_split_key(names, seed):
    """`names` in the order the split draws them: validation first."""
    return sorted(names, key=lambda s: (splitmix64(fnv1a64(s) ^ splitmix64(seed)), s))
