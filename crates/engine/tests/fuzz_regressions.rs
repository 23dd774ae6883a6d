//! Inputs the fuzzers found, kept as regression tests.

#[test]
fn clone_copy_resize_delete_keeps_a_checkpointable_state() {
    sliver_engine::fuzz_log(include_bytes!("fuzz/clone_copy_resize_delete.bin"));
}

/// A format 2 checkpoint declaring more segments or a larger chunk id than its log can hold
/// is refused before anything is allocated for them (it took 2.3 GB under the fuzzer).
#[test]
fn a_legacy_checkpoint_with_huge_tables_is_refused_without_allocating_them() {
    let input = include_bytes!("fuzz/legacy_checkpoint_huge_tables.bin");
    assert!(sliver_engine::legacy::checkpoint::decode(input, 256 << 20).is_err());
}

/// The seeds of the engine fuzz targets are valid inputs (a seed the decoder refuses would
/// leave the fuzzer mutating noise): the root decodes and names a page that reads back.
#[test]
fn the_page_fuzz_seed_is_a_valid_root_and_page() {
    use sliver_engine::meta::page_store::{read_page, PageBody, PageSource, PAGE_BYTES};
    use sliver_engine::meta::pager::decode_directory;
    use sliver_engine::meta::root::Root;
    let seed = include_bytes!("../../../fuzz/corpus/engine_page/root_one_page");
    let len = u16::from_le_bytes([seed[0], seed[1]]) as usize;
    let root = Root::decode(&seed[2..2 + len]).expect("the seed's root decodes");
    struct Area<'a>(&'a [u8]);
    impl PageSource for Area<'_> {
        fn read_slot(&self, slot: u64, buf: &mut PageBody) -> std::io::Result<()> {
            let at = slot as usize * PAGE_BYTES;
            buf.copy_from_slice(&self.0[at..at + PAGE_BYTES]);
            Ok(())
        }
    }
    let area = Area(&seed[2 + len..]);
    let t = &root.tables[0];
    let dir_page = read_page(&area, 128 + t.table, 0, t.dir[0]).expect("directory page");
    let dir = decode_directory(t.pages, &[dir_page], root.version);
    let page = read_page(&area, t.table, 0, dir[0]).expect("the page it names");
    assert_eq!(page[0], 0x22);
    sliver_engine::fuzz_page(seed);
    sliver_engine::fuzz_log(include_bytes!(
        "../../../fuzz/corpus/engine_log/format3_chunk_map_copy_release"
    ));
}

/// The format 4 seed is valid too: its root decodes, and the journal page it names applies its
/// word on top of the chunk page's base (so the fuzzer starts from a journal that is used).
#[test]
fn the_format_4_page_seed_has_a_journal_that_applies() {
    use sliver_engine::meta::page_store::{PageBody, PageSource, PAGE_BYTES};
    use sliver_engine::meta::pager::Pager;
    use sliver_engine::meta::root::{Root, ROOT_VERSION};
    use sliver_engine::meta::tables::{CHUNK_TABLE, T_JOURNAL};
    let seed = include_bytes!("../../../fuzz/corpus/engine_page/format4_root_with_a_journal");
    let len = u16::from_le_bytes([seed[0], seed[1]]) as usize;
    let root = Root::decode(&seed[2..2 + len]).expect("the seed's root decodes");
    assert_eq!(root.version, ROOT_VERSION);
    struct Area(Vec<u8>);
    impl PageSource for Area {
        fn read_slot(&self, slot: u64, buf: &mut PageBody) -> std::io::Result<()> {
            let at = slot as usize * PAGE_BYTES;
            buf.copy_from_slice(&self.0[at..at + PAGE_BYTES]);
            Ok(())
        }
    }
    let area = std::sync::Arc::new(Area(seed[2 + len..].to_vec()));
    let mut pager = Pager::new(area.clone(), 4);
    pager
        .load_directories(&root.tables, root.version)
        .expect("the directories load through their top pages");
    pager.load_journal().expect("the journal loads");
    assert_eq!(pager.journal().words(), 1);
    assert!(!pager.directory(T_JOURNAL).is_empty());
    let page = pager.page(CHUNK_TABLE, 0).expect("the chunk page");
    assert_eq!(
        page[16..24],
        0x5555u64.to_le_bytes(),
        "word 2 from the journal"
    );
    assert_eq!(page[0], 0x22, "the rest from the base");
    sliver_engine::fuzz_page(seed);
}

/// The operation-sequence fuzzer's seeds run clean: a write, a flush and a crash that keeps
/// nothing; a failed sync, the restart it forces, and a crash that keeps a random part.
#[test]
fn the_operation_sequence_seeds_agree_with_the_model() {
    sliver_engine::fuzz_ops(include_bytes!(
        "../../../fuzz/corpus/engine_ops/write_flush_crash_read"
    ));
    sliver_engine::fuzz_ops(include_bytes!(
        "../../../fuzz/corpus/engine_ops/failed_sync_then_crash"
    ));
}
