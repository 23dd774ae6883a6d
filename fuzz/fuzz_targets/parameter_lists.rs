//! Well-formed CDBs carrying arbitrary parameter lists: UNMAP, PERSISTENT RESERVE OUT,
//! MODE SELECT(6)/(10), EXTENDED COPY, POPULATE TOKEN and WRITE USING TOKEN. The first input byte picks the command and its
//! service action; the rest is the parameter list, whose length the CDB declares exactly.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, params)) = data.split_first() else {
        return;
    };
    let len = params.len().min(u16::MAX as usize);
    let params = &params[..len];
    let l16 = (len as u16).to_be_bytes();
    let l32 = (len as u32).to_be_bytes();
    let cdb: Vec<u8> = match selector % 7 {
        0 => vec![0x42, 0, 0, 0, 0, 0, 0, l16[0], l16[1], 0],
        1 => vec![0x5f, selector >> 3 & 0x1f, 0x01, 0, 0, l32[0], l32[1], l32[2], l32[3], 0],
        2 => vec![0x15, 0x10, 0, 0, len.min(255) as u8, 0],
        3 => vec![0x55, 0x10, 0, 0, 0, 0, 0, l16[0], l16[1], 0],
        4 => vec![0x83, 0, 0, 0, 0, 0, 0, 0, 0, 0, l32[0], l32[1], l32[2], l32[3], 0, 0],
        5 => vec![0x83, 0x10, 0, 0, 0, 0, 0, 0, 0, 1, l32[0], l32[1], l32[2], l32[3], 0, 0],
        _ => vec![0x83, 0x11, 0, 0, 0, 0, 0, 0, 0, 1, l32[0], l32[1], l32[2], l32[3], 0, 0],
    };
    let params = if selector % 7 == 2 { &params[..len.min(255)] } else { params };
    let mut input = Vec::with_capacity(1 + cdb.len() + params.len());
    input.push(cdb.len() as u8);
    input.extend_from_slice(&cdb);
    input.extend_from_slice(params);
    sliver_scsi::fuzz_cdb(&input);
});
