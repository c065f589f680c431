"""Uneven batches per rank, from each rank's loader lengths (the comparison; the exchange runs in
tests/multiproc/test_accelerate_loop.py)."""

import torch

from hf_zero.batch_counts import loader_lengths, uneven_batches


def test_lengths_that_differ_between_ranks_are_named_with_each_ranks_count():
    found = uneven_batches([[3], [2]])
    assert found.startswith("uneven batches per rank") and "3 on rank 0, 2 on rank 1" in found
    assert "loader 2 of 2" in uneven_batches([[4, 3], [4, 2]])


def test_quiet_when_every_rank_has_as_many_batches_or_a_loader_has_no_length():
    assert uneven_batches([[3, 5], [3, 5]]) is None
    assert uneven_batches([[None], [None]]) is None
    assert uneven_batches([[], []]) is None


def test_an_iterable_dataset_has_no_length_and_a_map_style_one_counts_its_batches():
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(5))

    loaders = [torch.utils.data.DataLoader(list(range(9)), batch_size=2), torch.utils.data.DataLoader(Stream())]
    assert loader_lengths(loaders) == [5, None]
