from tandem.durable import replace_durably


def test_a_durable_replace_leaves_the_new_content_and_no_temporary_file(tmp_path):
    target = tmp_path / "latest"
    target.write_text("step_000002")
    replace_durably(target, "step_000004")
    assert target.read_text() == "step_000004"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest"]
