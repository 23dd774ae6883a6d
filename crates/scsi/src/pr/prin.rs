//! PERSISTENT RESERVE IN: the parameter data of READ KEYS, READ RESERVATION, REPORT
//! CAPABILITIES and READ FULL STATUS, built from the state.

use super::model::SCOPE_LU;
use super::prout::encode_transport_id;
use super::state::PrState;

/// Prefixes parameter data with PRGENERATION and ADDITIONAL LENGTH.
fn with_header(generation: u32, body: Vec<u8>) -> Vec<u8> {
    let mut data = Vec::with_capacity(8 + body.len());
    data.extend_from_slice(&generation.to_be_bytes());
    data.extend_from_slice(&u32::try_from(body.len()).unwrap_or(u32::MAX).to_be_bytes());
    data.extend_from_slice(&body);
    data
}

impl PrState {
    pub(super) fn read_keys(&self) -> Vec<u8> {
        let keys = self
            .registrations
            .iter()
            .flat_map(|r| r.key.to_be_bytes())
            .collect();
        with_header(self.generation, keys)
    }

    pub(super) fn read_reservation(&self) -> Vec<u8> {
        let mut body = Vec::new();
        if let Some(reservation) = &self.reservation {
            // All-registrants reservations have no single key: report 0 (SPC-4).
            let key = if reservation.pr_type.all_registrants() {
                0
            } else {
                self.holder_key().unwrap_or(0)
            };
            body.extend_from_slice(&key.to_be_bytes());
            body.extend_from_slice(&[0; 4]); // obsolete
            body.push(0);
            body.push(SCOPE_LU << 4 | reservation.pr_type.code());
            body.extend_from_slice(&[0; 2]); // obsolete
        }
        with_header(self.generation, body)
    }

    pub(super) fn report_capabilities(&self, persist_capable: bool) -> Vec<u8> {
        const CRH: u8 = 0x10; // compatible reservation handling (SPC-4)
        const SIP_C: u8 = 0x08; // SPEC_I_PT supported
        const ATP_C: u8 = 0x04; // ALL_TG_PT supported
        const PTPL_C: u8 = 0x01; // APTPL supported
        const TMV: u8 = 0x80; // type mask valid
                              // ALLOW COMMANDS 001b: TEST UNIT READY is allowed under WE and EA reservations.
        const ALLOW_COMMANDS_TUR: u8 = 0b001 << 4;
        const PTPL_A: u8 = 0x01; // APTPL active
        let mut data = vec![0u8; 8];
        data[1] = 8; // LENGTH
        data[2] = CRH | SIP_C | ATP_C | if persist_capable { PTPL_C } else { 0 };
        data[3] = TMV | ALLOW_COMMANDS_TUR | if self.aptpl { PTPL_A } else { 0 };
        // PERSISTENT RESERVATION TYPE MASK: every type.
        data[4] = 0x80 | 0x40 | 0x20 | 0x08 | 0x02; // WR_EX_AR EX_AC_RO WR_EX_RO EX_AC WR_EX
        data[5] = 0x01; // EX_AC_AR
        data
    }

    pub(super) fn read_full_status(&self) -> Vec<u8> {
        let mut body = Vec::new();
        for registration in &self.registrations {
            let holder = self
                .reservation
                .as_ref()
                .filter(|r| r.pr_type.all_registrants() || r.holder == registration.registrant);
            let transport_id = encode_transport_id(&registration.registrant.initiator);
            body.extend_from_slice(&registration.key.to_be_bytes());
            body.extend_from_slice(&[0; 4]);
            let all_tg_pt = registration.registrant.target_port.is_none();
            body.push(u8::from(all_tg_pt) << 1 | u8::from(holder.is_some()));
            body.push(holder.map_or(0, |r| SCOPE_LU << 4 | r.pr_type.code()));
            body.extend_from_slice(&[0; 4]);
            // RELATIVE TARGET PORT IDENTIFIER: not meaningful with ALL_TG_PT.
            let target_port = registration.registrant.target_port.unwrap_or(0);
            body.extend_from_slice(&target_port.to_be_bytes());
            let id_len = u32::try_from(transport_id.len()).unwrap_or(u32::MAX);
            body.extend_from_slice(&id_len.to_be_bytes());
            body.extend_from_slice(&transport_id);
        }
        with_header(self.generation, body)
    }
}
